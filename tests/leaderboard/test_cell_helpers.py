"""leaderboard/cells.py's helpers on small hand-made frames: the cell key's defaults, one run per
seed, the early-verdict and verification texts, the orderings and the settings label (the
mirror, test_cells.py, drives them through a store and the app)."""

import math

import pandas as pd
import pytest

from bench.fingerprint import fingerprint
from leaderboard.cells import (_median, by_staleness, cells_frame, fingerprint_configs, ranked_cells, seed_runs,
                               settings_label, with_cell_key, with_staleness)


def _runs(**cols):
    base = {"model": "m", "build": "b", "algo": "grpo", "precision": "fp16", "trainer": "native", "engine": "torch",
            "staleness": 0, "config_fp": "fp"}
    n = max(len(v) for v in cols.values())
    return pd.DataFrame({**{k: [v] * n for k, v in base.items()}, **cols})


def test_staleness_is_an_integer_zero_where_missing():
    assert list(with_staleness(pd.DataFrame({"staleness": [None, 2.0]})).staleness) == [0, 2]
    assert list(with_staleness(pd.DataFrame({"x": [1, 2]})).staleness) == [0, 0]


def test_the_cell_key_keeps_a_stored_fingerprint_and_fills_what_is_missing():
    kept = with_cell_key(pd.DataFrame({"config_fp": ["abc"], "config": [{"lr": 1}], "engine": ["vllm"]}))
    assert list(kept.config_fp) == ["abc"] and list(kept.engine) == ["vllm"]
    filled = with_cell_key(pd.DataFrame({"config": [{"lr": 1}]}))
    assert list(filled.config_fp) == [fingerprint({"lr": 1})] and list(filled.engine) == [None]
    assert list(with_cell_key(pd.DataFrame({"x": [1]})).config_fp) == [fingerprint(None)]


def test_one_run_per_seed_the_newest_even_where_the_key_has_none():
    r = _runs(engine=[None, None, None], seed=[0, 0, 1], run=["old", "new", "one"], created_at=[1, 2, 3])
    assert list(seed_runs(r).run) == ["new", "one"]                 # engine None is a key value, not a drop
    unseeded = _runs(seed=[None, 1, 0], run=["none", "one", "zero"])
    assert list(seed_runs(unseeded).run) == ["none", "one", "zero"]     # no seed is a seed of its own


def _cell(**cols):
    n = max(len(v) for v in cols.values())
    full = {"sanity": ["PASS"] * n, "status": ["converged"] * n, "peak_accuracy": [0.96] * n,
            "steps_to_target": [10] * n, "run": [f"r{i}" for i in range(n)], **cols}
    return _runs(**full)


def test_early_verdicts_from_the_status_and_steps_where_the_frame_has_no_decision_columns():
    (row,) = cells_frame(_cell(seed=[1, 0], status=["converged", "max_steps"], steps=[40, 80])).to_dict("records")
    assert row["early"] == "seed 1: PASS by converged at step 40"
    assert row["seeds"] == [0, 1]
    (row,) = cells_frame(_cell(seed=[None], status=["futile"], sanity=["FAIL"], steps=[30])).to_dict("records")
    assert row["early"] == "FAIL by futile at step 30"                  # no seed, no "seed" prefix
    (row,) = cells_frame(_cell(seed=[0], status=["futile"], sanity=["FAIL"])).to_dict("records")
    assert row["early"] is None                                         # no step: no early verdict in words


def test_verification_in_words_only_where_the_frame_has_it():
    (row,) = cells_frame(_cell(seed=[0])).to_dict("records")
    assert row["verification"] is None
    (row,) = cells_frame(_cell(seed=[0], verification_level=["claimed"], verification=["claimed"],
                               verified=[False])).to_dict("records")
    assert row["verification"] == "claimed (not re-run)"


def test_ranked_and_staleness_orders_keep_the_columns_and_a_fresh_index():
    cells = pd.DataFrame({"sanity": ["FAIL", "PASS", "PASS"], "steps_to_pass_median": [math.nan, 30, 20],
                          "pass_rate": [0.0, 1.0, 1.0], "peak_mean": [0.5, 0.96, 0.97], "staleness": [2, 0, 1]},
                         index=[7, 8, 9])
    ranked = ranked_cells(cells)
    assert list(ranked.columns) == list(cells.columns) and list(ranked.index) == [0, 1, 2]
    assert list(ranked.steps_to_pass_median.fillna(-1)) == [20, 30, -1]
    by_k = by_staleness(cells)
    assert list(by_k.columns) == list(cells.columns) and list(by_k.index) == [0, 1, 2]
    assert list(by_k.staleness) == [0, 1, 2]
    assert list(by_staleness(cells.drop(columns="staleness")).index) == [7, 8, 9]    # no K: as it was


def test_fingerprint_configs_maps_each_fingerprint_to_its_newest_config():
    runs = pd.DataFrame({"config_fp": ["a", "a", "b"], "config": [{"lr": 1}, {"lr": 2}, {"lr": 3}],
                         "created_at": [2, 1, 3]})
    assert fingerprint_configs(runs) == {"a": {"lr": 1}, "b": {"lr": 3}}
    assert fingerprint_configs(runs.drop(columns="config")) == {}


def test_settings_label_names_at_most_three_settings_then_counts_the_rest():
    spread = [(k, {"f1": i}) for i, k in enumerate(["lr", "kl", "eval_every", "seed_x"])]
    assert settings_label("f1", spread) == "cfg f1: lr=0, kl=1, eval_every=2, +1 more"
    assert settings_label("f1", spread[:3]) == "cfg f1: lr=0, kl=1, eval_every=2"
    assert settings_label("f1", []) == "cfg f1"


def test_median_of_odd_and_even_counts():
    assert _median([5, 1, 4, 2, 3]) == 3 and _median([4, 1, 3, 2]) == 2.5 and math.isnan(_median([]))


def test_early_verdicts_from_the_decision_columns_where_the_frame_has_them():
    (row,) = cells_frame(_cell(seed=[0], status=["max_steps"], decided_by=["futile"], decided_step=[30],
                               sanity=["FAIL"])).to_dict("records")
    assert row["early"] == "seed 0: FAIL by futile at step 30"


def test_a_cell_per_key_even_without_an_engine_after_a_cell_all_of_whose_seeds_were_skipped():
    runs = pd.concat([_cell(seed=[0, 1], status=["skipped", "skipped"], algo=["grpo"] * 2),
                      _cell(seed=[0, 1], engine=[None, None], algo=["gspo"] * 2, peak_accuracy=[0.9, 0.96],
                            mean_router_flip_frac=[0.1, 0.3])], ignore_index=True)
    (row,) = cells_frame(runs).to_dict("records")
    assert row["algo"] == "gspo" and pd.isna(row["engine"]) and row["n_seeds"] == 2
    assert row["peak_sd"] == pytest.approx(math.sqrt(2 * 0.03 ** 2))          # two seeds: s with n − 1 = 1
    assert row["router_flip_median"] == pytest.approx(0.2)
