"""The app's tables show missing values as "–" (not "None"), and the Leaderboard page's
Reference expander lists the paper's published rows apart from the ranking; on a hand-made
store (AppTest, no browser)."""

import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import app_page

from leaderboard.display import MISSING, HAS_PLACEHOLDER, cell_text, display_frame, is_missing, table_kwargs
from leaderboard.reference import matching_rows, reference_rows

MY_PAGES = ["pages/leaderboard.py", "pages/builds.py", "pages/compare.py", "pages/mismatch.py"]


def test_missing_values_become_a_dash_on_display_copies_only():
    assert MISSING == "–"
    for x in (None, float("nan"), pd.NA, pd.NaT):
        assert is_missing(x) and cell_text(x) == MISSING
    for x in ("", [], 0, 0.0, "None?"):
        assert not is_missing(x)
    assert cell_text([0, None, 2]) == "0 – 2" and cell_text([]) == MISSING and cell_text(("a",)) == "a"
    assert cell_text(0.5) == "0.5" and cell_text("grpo") == "grpo"
    df = pd.DataFrame({"algo": ["grpo", None], "seeds": [[None], [0, 1]], "peak": [0.9, math.nan],
                       "n": [1, 2], "ok": [True, False]})
    shown = display_frame(df)
    assert list(shown.algo) == ["grpo", "–"] and list(shown.seeds) == ["–", "0 1"]
    assert shown.peak.dtype == float and math.isnan(shown.peak[1])          # numbers stay numbers ...
    assert shown.n.dtype == df.n.dtype and shown.ok.dtype == bool
    assert is_missing(df.algo[1]) and df.seeds[0] == [None]                 # ... and the frame is untouched
    assert "None" not in shown.astype(str).drop(columns=["peak"]).to_string()


def test_the_table_placeholder_draws_numeric_gaps_as_a_dash():
    assert HAS_PLACEHOLDER                      # streamlit in .venv (1.67) has st.dataframe(placeholder=)
    assert table_kwargs(hide_index=True) == {"hide_index": True, "placeholder": "–"}


def test_my_pages_show_every_table_through_the_display_helper():
    root = Path(__file__).parents[2] / "leaderboard"
    for page in MY_PAGES:
        text = (root / page).read_text()
        assert "st.dataframe(" not in text and "display.dataframe(" in text, page


@pytest.fixture
def store(tmp_path, monkeypatch):
    from test_report_summary import _store          # the hand-made store of the report tests

    url = f"sqlite:///{tmp_path / 's.db'}"
    _store(url)
    monkeypatch.setenv("BENCH_DB_URL", url)
    return url


def _page(path=None):
    return app_page(path)


def test_leaderboard_page_dashes_and_reference_expander(store):
    at = _page()
    main, ref = at.dataframe[0], at.dataframe[1]
    assert main.proto.placeholder == "–" and ref.proto.placeholder == "–"
    cells = main.value
    assert list(cells.algo) == ["pg-seq-is", "pg-seq-is", "grpo", "grpo"]
    assert list(cells.seeds) == ["0 1", "0", "0", "0"]
    assert "Reference" in at.expander[0].label and "not ranked" in at.expander[0].label
    table = ref.value
    rows = reference_rows()
    hit, _ = matching_rows(zip(cells.algo, cells.precision), rows)
    assert len(table) == len(rows) and int(table["on this page"].sum()) == len(hit) == 6
    assert list(table["on this page"][:len(hit)]) == [True] * len(hit)       # the cells shown come first
    assert set(table.source) == {"paper", "paper (verl)", "paper (oat)"}
    assert (table.algo == "–").sum() == 3                                   # the precision ablation rows
    assert "None" not in table.drop(columns=["peak_train_acc", "on this page"]).to_string()
    assert not set(table.source) & set(cells.get("source", []))             # never among the ranked cells


def test_mismatch_and_compare_pages_use_the_placeholder(store):
    at = _page("pages/mismatch.py")
    assert at.dataframe[0].proto.placeholder == "–" and len(at.dataframe[0].value) == 4
    at = _page("pages/compare.py")
    assert at.dataframe[0].proto.placeholder == "–"
    table = at.dataframe[0].value
    assert "None" not in table.to_string()
    assert table.loc["threads"].tolist() == ["–", "1", "1"]            # run f0's threads=None
