"""`bench report`'s closing summary (which cells pass, how each run ended, the bf16 ÷ fp16
mismatch ratios, online and offline) and the paper's reference rows (loaded from the packaged
paper_reference.json, matched to our cells, never ranked with them), on a hand-made store."""

import json
from datetime import datetime, timedelta

import pandas as pd
import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.problems import paper_reference
from bench.precision import pair_name
from bench.store import MismatchReport, Run, RunStep, open_store, session
from conftest import add_model_and_build
from leaderboard.reference import ALL_FIVE, COLUMNS, matching_rows, paper_offline_mismatch, reference_rows


def test_reference_rows_load_from_the_packaged_file():
    ref = paper_reference()
    rows = reference_rows()
    assert rows == reference_rows(ref) and all(list(r) == COLUMNS for r in rows)
    n_runs = len(ref["runs"])
    assert len(rows) == n_runs - 1 + len(ALL_FIVE)           # "all five" stands for each of the five
    five = [r for r in rows if "all five" in (r["note"] or "")]
    assert sorted(r["algo"] for r in five) == sorted(ALL_FIVE)
    assert all((r["precision"], r["aime24"], r["source"]) == ("fp16", "0.37-0.39", "paper") for r in five)
    by = {(r["algo"], r["precision"], r["source"]): r for r in rows if r not in five}
    assert len(by) == len(rows) - len(five)
    g = by[("grpo", "bf16", "paper (verl)")]
    assert (g["peak_train_acc"], g["aime24"], g["outcome"]) == (0.73, "0.28-0.30 (peak)", "collapsed")
    assert by[("grpo", "bf16", "paper (oat)")]["peak_train_acc"] == 0.84
    p = by[("pg-seq-is", "fp16", "paper")]
    assert (p["peak_train_acc"], p["aime24"], p["outcome"]) == (0.99, "0.39", "converged")
    ablation = [r for r in rows if r["algo"] is None]
    assert sorted(r["precision"] for r in ablation) == ["fp16", "fp16→bf16", "fp32→bf16"]
    assert by[("gspo", "bf16", "paper (verl)")]["peak_train_acc"] is None
    # every algorithm named is one of ours
    from bench.algorithms import ALGORITHMS
    assert {r["algo"] for r in rows} - {None} <= set(ALGORITHMS)
    assert pair_name("fp32", "bf16") == "fp32→bf16" and pair_name("fp16", "fp16") == "fp16"


def test_reference_rows_match_our_cells_and_count_the_others():
    rows = reference_rows()
    hit, others = matching_rows([("pg-seq-is", "fp16"), ("grpo", "bf16")], rows)
    assert {(r["algo"], r["precision"], r["source"]) for r in hit} == {
        ("pg-seq-is", "fp16", "paper"), ("grpo", "bf16", "paper (verl)"), ("grpo", "bf16", "paper (oat)"),
        (None, "fp16", "paper")}                 # the fp16/fp16 ablation row matches any fp16 cell
    assert ("pg-seq-is", "fp16", "paper") in {(r["algo"], r["precision"], r["source"]) for r in hit}
    assert len([r for r in hit if (r["algo"], r["precision"]) == ("pg-seq-is", "fp16")]) == 2   # own + all five
    assert others == len(rows) - len(hit)
    assert matching_rows([], rows) == ([], len(rows))
    assert matching_rows([("gspo", "fp8")], rows) == ([], len(rows))


def test_paper_offline_mismatch():
    m = paper_offline_mismatch()
    assert (m["kl_bits_bf16"], m["kl_bits_fp16"]) == (7.64, 0.32)
    assert m["ratio_bf16_over_fp16"] == pytest.approx(23.875) and m["ratio_as_published"] == "approx 24x"


# the conditions of the fixture's offline reports (all alike)
CONDITIONS = {"engine": "torch", "limit": 100, "max_tokens": 64, "device": "cpu", "cpu_16bit": "none",
              "attention": None}


def _store(url):
    """pg-seq-is fp16 (seed 0 converged at 37, seed 1 converged at 45), pg-seq-is bf16 (max_steps,
    KL warning at step 12), grpo bf16 (collapsed), grpo fp32 (running); KL k3 by run; offline
    mismatch reports for bf16 and fp16 (an older bf16 one is superseded); run f0's config has
    threads None (a missing value for the Compare page)."""
    engine = open_store(url)
    t0 = datetime(2026, 1, 1)
    with session(engine) as s:
        model_id = add_model_and_build(s)
        rows = [("f0", "pg-seq-is", "fp16", 0, "converged", "split accuracy lower bound 0.951 >= 0.95", 0.97, 37, 37,
                 None, 1e-4),
                ("f1", "pg-seq-is", "fp16", 1, "converged", "split accuracy lower bound 0.952 >= 0.95", 0.98, 45, 45,
                 None, 3e-4),
                ("h0", "pg-seq-is", "bf16", 0, "max_steps", "reached max_steps=60", 0.80, None, 60, 12, 4e-3),
                ("g0", "grpo", "bf16", 0, "collapsed", "split accuracy 0.31 fell below 0.5 x peak 0.70", 0.70, None,
                 50, 20, 9e-3),
                ("r0", "grpo", "fp32", 0, "running", None, 0.60, None, 20, None, 1e-6)]
        for i, (rid, algo, dt, seed, status, reason, peak, to_target, step, warn, kl) in enumerate(rows):
            s.add(Run(id=rid, model_id=model_id, build_id="b0", algo=algo, rollout_dtype=dt, train_dtype=dt,
                      trainer="native", engine="torch", status=status,
                      config={"preset": "tiny", "seed": seed, "threads": None if rid == "f0" else 1},
                      stop_reason=reason, peak_accuracy=peak, steps_to_target=to_target, step=step,
                      kl_warning_step=warn, created_at=t0 + timedelta(minutes=i)))
            s.flush()
            s.add(RunStep.from_metrics(rid, step, {"kl_k3": kl}))
        for i, (dt, k3, k1) in enumerate([("bf16", 1.0, 1.0), ("bf16", 6e-3, 5e-3), ("fp16", 2e-4, 1e-4),
                                          ("fp32", 1e-9, 1e-9)]):
            s.add(MismatchReport(model_id=model_id, rollout_dtype=dt, train_dtype=dt, source="synthetic-hard", n=64,
                                 metrics={"kl_k3": k3, "kl_k1": k1}, plots={},
                                 created_at=t0 + timedelta(hours=1, minutes=i), **CONDITIONS))
    return engine


def test_report_summary_and_reference_in_json(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    _store(url)
    r = CliRunner().invoke(app, ["report", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == {"cells", "summary", "reference"}
    assert [(c["algo"], c["precision"], c["sanity"]) for c in doc["cells"]] == [
        ("pg-seq-is", "fp16", "PASS"), ("pg-seq-is", "bf16", "UNDECIDED"), ("grpo", "bf16", "FAIL"),
        ("grpo", "fp32", "RUNNING")]
    s = doc["summary"]
    assert (s["cells"], s["pass"], s["fail"], s["undecided"], s["running"]) == (4, 1, 1, 1, 1)
    first = s["per_cell"][0]
    assert (first["algo"], first["precision"], first["passes"], first["steps_to_pass_median"]) == \
        ("pg-seq-is", "fp16", "2/2", 41)
    assert [(x["run"], x["seed"], x["steps_to_pass"]) for x in first["runs"]] == [("f0", 0, 37), ("f1", 1, 45)]
    bf = s["per_cell"][1]["runs"][0]
    assert (bf["status"], bf["stop_reason"], bf["steps"], bf["kl_warning_step"], bf["steps_to_pass"]) == \
        ("max_steps", "reached max_steps=60", 60, 12, None)
    running = s["per_cell"][3]["runs"][0]
    assert (running["status"], running["stop_reason"], running["steps"]) == ("running", None, 20)
    # bf16 ÷ fp16 for the one algorithm with both cells: 4e-3 ÷ median(1e-4, 3e-4) = 20
    (ratio,) = s["mismatch_ratios"]
    assert (ratio["algo"], ratio["build"]) == ("pg-seq-is", "b0")
    assert ratio["kl_k3_bf16"] == pytest.approx(4e-3) and ratio["kl_k3_fp16"] == pytest.approx(2e-4)
    assert ratio["ratio"] == pytest.approx(20.0)
    (off,) = s["offline_mismatch_ratios"]                # the newest bf16 report (6e-3), not the old 1.0
    assert (off["model"], off["source"]) == ("tiny-math", "synthetic-hard")
    assert {k: off[k] for k in (*CONDITIONS, "n")} == {**CONDITIONS, "n": 64}
    assert off["ratio"] == pytest.approx(30.0) and off["ratio_k1"] == pytest.approx(50.0)
    ref = doc["reference"]
    got = {(x["algo"], x["precision"], x["source"]) for x in ref["rows"]}
    assert got == {("pg-seq-is", "fp16", "paper"), ("pg-seq-is", "bf16", "paper"), ("grpo", "bf16", "paper (verl)"),
                   ("grpo", "bf16", "paper (oat)"), (None, "fp16", "paper")}
    assert ref["others"] == len(reference_rows()) - len(ref["rows"]) > 0
    assert ref["offline_mismatch"]["ratio_as_published"] == "approx 24x"
    assert not any(c.get("source", "").startswith("paper") for c in doc["cells"])     # never ranked
    # --runs: the same summary and reference beside one row per run
    r = CliRunner().invoke(app, ["report", "--db", url, "--runs", "--json"])
    doc_runs = json.loads(r.stdout)
    assert set(doc_runs) == {"runs", "summary", "reference"} and len(doc_runs["runs"]) == 5
    assert doc_runs["summary"] == s and doc_runs["reference"] == ref


def test_report_prints_the_summary_then_the_reference_after_the_table(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    _store(url)
    csv = tmp_path / "r.csv"
    r = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["report", "--db", url, "--csv", str(csv)])
    assert r.exit_code == 0, r.output
    text = r.stdout
    i_table, i_summary, i_ref = text.index("steps→pass"), text.index("Summary"), text.index("Reference")
    assert i_table < i_summary < i_ref
    summary, reference = " ".join(text[i_summary:i_ref].split()), text[i_ref:]      # rich wraps long lines
    assert "1 of 4 cells pass on every seed (1 fail by a rule, 1 undecided, 1 running)" in summary
    # the fixture's runs store no split evaluation: their statuses stand as labels, and say so
    assert "PASS pg-seq-is fp16 (2/2 pass: p ≥ 0.22): seed 0: converged at step 37; label only" in summary
    assert "seed 1: converged at step 45" in summary
    assert ("UNDECIDED pg-seq-is bf16 (0/1 pass: p ≥ 0.00): seed 0: max_steps after 60 steps (reached max_steps=60); "
            "label only: no split evaluation stored, 'max_steps' is as recorded") in summary
    assert "KL early warning at step 12" in summary
    assert "RUNNING grpo fp32 (0/1 pass: p ≥ 0.00): seed 0: running, at step 20" in summary
    assert "pg-seq-is: 4.00e-03 ÷ 2.00e-04 = 20×" in summary
    assert "KL k3 6.00e-03 ÷ 2.00e-04 = 30×, KL k1 50×" in summary
    assert "synthetic-hard; torch, 100 problems × n 64, ≤64 tokens, cpu (16-bit path none)" in summary
    assert "paper (verl)" in reference and "paper (oat)" in reference and "(precision ablation)" in reference
    assert "7.64 ÷ 0.32 bits = 23.9×" in reference and "more published row(s)" in reference
    # the CSV keeps the table only
    import pandas as pd
    assert list(pd.read_csv(csv).algo) == ["pg-seq-is", "pg-seq-is", "grpo", "grpo"]
    # --runs as a table: each run's deciding rule and step, a status its evidence does not back marked
    r = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["report", "--db", url, "--runs"])
    assert r.exit_code == 0, r.output
    assert "decided" in r.stdout and "converged at step 37" in " ".join(r.stdout.split())


def test_report_of_an_empty_store(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    open_store(url)
    r = CliRunner().invoke(app, ["report", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["cells"] == [] and doc["summary"]["cells"] == 0 and doc["reference"]["rows"] == []
    assert doc["reference"]["others"] == len(reference_rows())
    r = CliRunner().invoke(app, ["report", "--db", url])
    assert "no runs yet" in r.stdout


def _reports(*rows):
    """A mismatch frame as `mismatch_frame` reads it: (pair, k3, minutes, conditions changed)."""
    base = {"model": "tiny-math", "source": "synthetic-hard", "n": 64, **CONDITIONS}
    return pd.DataFrame([{**base, **changed, "rollout_dtype": dt, "train_dtype": dt, "kl_k3": k3,
                          "created_at": datetime(2026, 1, 1, 0, minute)} for dt, k3, minute, changed in rows])


@pytest.mark.parametrize("condition, other", [("engine", "vllm"), ("limit", 8), ("limit", None), ("n", 4),
                                              ("max_tokens", 128), ("device", "cuda:0"), ("cpu_16bit", "all"),
                                              ("source", "synthetic"), ("model", "other"), ("attention", "cascade")])
def test_offline_ratios_pair_only_reports_of_the_same_conditions(condition, other):
    from leaderboard.summary import offline_ratios

    same = offline_ratios(_reports(("bf16", 6e-3, 0, {}), ("fp16", 2e-4, 1, {})))
    assert [r["ratio"] for r in same] == [pytest.approx(30.0)]
    # the newest fp16 report was measured otherwise: bf16 pairs with the older fp16 of its own conditions
    rows = _reports(("bf16", 6e-3, 0, {}), ("fp16", 3e-4, 1, {}), ("fp16", 2e-4, 2, {condition: other}))
    (r,) = offline_ratios(rows)
    assert r["ratio"] == pytest.approx(20.0)
    assert r[condition] == {"model": "tiny-math", "source": "synthetic-hard", "n": 64, **CONDITIONS}[condition]
    assert offline_ratios(_reports(("bf16", 6e-3, 0, {}), ("fp16", 2e-4, 1, {condition: other}))) == []


def test_reports_without_conditions_are_not_paired():
    from leaderboard.summary import offline_ratios

    legacy = {"engine": None, "limit": None, "max_tokens": None, "device": None, "cpu_16bit": None}
    assert offline_ratios(_reports(("bf16", 6e-3, 0, legacy), ("fp16", 2e-4, 1, legacy))) == []
    assert offline_ratios(_reports(("bf16", 6e-3, 0, legacy), ("fp16", 2e-4, 1, {}))) == []


@pytest.mark.integration
def test_bench_mismatch_stores_its_conditions_and_the_report_pairs_by_them(tmp_path):
    """Two real `bench mismatch` runs on different problem counts: the fp16 report of the second
    (the newest) is not divided into the first's bf16 one."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = CliRunner().invoke(app, ["mismatch", "--dtype", "bf16,fp16", "--limit", "4", "--n", "2", "--device", "cpu",
                                     "--db", url, "--json", "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    k3 = {x["rollout"]: x["kl_k3"] for x in json.loads(first.stdout)}
    second = CliRunner().invoke(app, ["mismatch", "--dtype", "fp16", "--limit", "2", "--n", "2", "--device", "cpu",
                                      "--db", url, "--json", "--out", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    from bench.kernels import cpu_kernel_path
    from leaderboard.queries import mismatch_frame

    frame = mismatch_frame(open_store(url))
    assert sorted(frame.limit) == [2, 4, 4] and set(frame.engine) == {"torch"} and set(frame.n) == {2}
    assert (set(frame.max_tokens) == {64} and set(frame.device) == {"cpu"}
            and set(frame.cpu_16bit) == {cpu_kernel_path()})
    r = CliRunner().invoke(app, ["report", "--db", url, "--json"])
    (ratio,) = json.loads(r.stdout)["summary"]["offline_mismatch_ratios"]
    assert ratio["limit"] == 4 and ratio["ratio"] == pytest.approx(k3["bf16"] / k3["fp16"])
