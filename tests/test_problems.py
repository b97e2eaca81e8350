import json

import pytest

from bench.problems import (ColumnMap, SourceError, SourceSpec, last_boxed, load_problems, problem_id,
                            synthetic_examples)


def test_last_boxed_takes_last_and_balances_braces():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{2}{3}}") == r"\frac{2}{3}"
    assert last_boxed(r"\boxed{840} and \boxed{840}") == "840"   # never glued (Math-Verify #44)
    assert last_boxed(r"\boxed{3") is None
    assert last_boxed("no box") is None
    assert last_boxed(r"\fbox{7}") == "7"


def test_synthetic_is_deterministic_and_test_never_overlaps_train():
    a = synthetic_examples("test", 200, seed=3)
    assert a == synthetic_examples("test", 200, seed=3)
    train = {r["problem"] for r in synthetic_examples("train", 3000, seed=3)}
    assert not train & {r["problem"] for r in a}
    assert {r["kind"] for r in a} == {"add", "sub", "mul", "two-step"}
    for r in a:
        assert r["solution"].endswith(f"\\boxed{{{r['answer']}}}")
        assert str(eval(r["problem"][len("Compute "):-1])) == r["answer"]


def test_synthetic_hard_is_three_steps():
    rows = synthetic_examples("synthetic-hard", 20)
    assert all(r["kind"] == "hard" and r["solution"].count(". ") == 3 for r in rows)


def test_jsonl_csv_parquet_and_dataset_dir_give_the_same_problems(tmp_path):
    import datasets
    import pandas as pd

    rows = [{"id": "a", "problem": "1+1?", "answer": "2"}, {"id": "b", "problem": "2+2?", "answer": "4"}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    pd.DataFrame(rows).to_csv(tmp_path / "p.csv", index=False)
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    got = [load_problems(SourceSpec(str(tmp_path / f))) for f in ("p.jsonl", "p.csv", "p.parquet", "ds")]
    assert all(g == got[0] for g in got)
    assert [p.id for p in got[0]] == ["a", "b"]


def test_column_mapping_solution_boxed_and_hashed_ids(tmp_path):
    rows = [{"question": "What is 6*7?", "solution": r"So \boxed{42}."}]
    (tmp_path / "m.jsonl").write_text(json.dumps(rows[0]))
    (p,) = load_problems(SourceSpec(str(tmp_path / "m.jsonl"), ColumnMap(problem="question")))
    assert p.answer == "42" and p.id == problem_id("What is 6*7?") and len(p.id) == 12


@pytest.mark.parametrize("content,needle", [
    ('{"problem": "x"}\n', "no answer"),
    ('{"answer": "1"}\n', "no 'problem' text"),
    ('{"problem": "x", "answer": "1"\n', "malformed JSON"),
    ("", "no problems"),
    ('{"id": 1, "problem": "x", "answer": "1"}\n{"id": 1, "problem": "y", "answer": "2"}\n', "duplicate id"),
])
def test_bad_rows_raise_one_clear_message(tmp_path, content, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(SourceError, match=needle):
        load_problems(SourceSpec(str(f)))


def test_unknown_source_and_offline_hub_fail_readably():
    with pytest.raises(SourceError, match="unknown source"):
        load_problems(SourceSpec("./nope.jsonl"))
    with pytest.raises(SourceError, match="cannot load hub dataset"):
        load_problems(SourceSpec("no-such-owner/no-such-dataset"))


def test_shared_math500_loads(shared_data):
    probs = load_problems(SourceSpec(f"{shared_data}/math500.jsonl"))
    assert len(probs) == 500 and all(p.answer for p in probs)
