"""Shadow decisions: the trainer records every stop rule's first decision, on or off; the same
decisions recomputed from the stored evaluations agree (the back-fill of older runs); and
`bench report --early`'s agreement and steps-saved table against hand-computed values."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from sqlalchemy import delete, select
from typer.testing import CliRunner

from bench.cli import app
from runners.early_decisions import RunShadow, rule_table
from bench.statuses import verdict
from bench.stop import COLLAPSED, CONVERGED, FUTILE, PLATEAUED


def _shadow(run, status, steps, decisions, off=(FUTILE, PLATEAUED, COLLAPSED)):
    on = {r: r not in off for r in (CONVERGED, COLLAPSED, FUTILE, PLATEAUED)}
    return RunShadow(run, status, steps, verdict(status), on,
                     {r: [s, r, ""] for r, s in decisions.items()}, "recorded")


def test_rule_table_by_hand():
    shadows = [
        # a run that passed at 60; futility never decided, plateaued would have said FAIL at 50
        _shadow("a", CONVERGED, 60, {CONVERGED: 60, PLATEAUED: 50}),
        # two runs to max_steps 150 (UNDECIDED: a FAIL holds, they did not pass within the budget):
        # futile at 90 and 100, plateaued at 120 and never
        _shadow("b", "max_steps", 150, {FUTILE: 90, PLATEAUED: 120}),
        _shadow("c", "max_steps", 150, {FUTILE: 100}),
        # plateau on here: not measured for plateaued (it ended the run), measured for futility
        _shadow("d", PLATEAUED, 110, {FUTILE: 80, PLATEAUED: 110}, off=(FUTILE,)),
    ]
    rows = {r["rule"]: r for r in rule_table(shadows)}
    f = rows[FUTILE]
    # futility: 4 runs, 3 decided, none passed: agreement 4/4; saved (60 + 50 + 30) / (60+150+150+110)
    #   = 140 / 470; steps ÷ today's other rules (converged, collapsed; plateaued is off by default):
    #   b 90/150 = 0.6, c 100/150 = 0.667, d 80/110 = 0.727 → median 0.667
    assert (f["runs"], f["decided"], f["agree"], f["false_fail"]) == (4, 3, 4, 0)
    assert f["steps_saved"] == pytest.approx(140 / 470)
    assert f["fail_step_vs_today_median"] == pytest.approx(100 / 150)
    p = rows[PLATEAUED]
    # plateaued: runs a, b, c (d had it on); decided a (FAIL on a PASS run: false FAIL) and b;
    #   agreement (3 − 2 + 1)/3; saved (150 − 120) / 360
    assert (p["runs"], p["decided"], p["agree"], p["false_fail"]) == (3, 2, 2, 1)
    assert p["agreement"] == pytest.approx(2 / 3) and p["steps_saved"] == pytest.approx(30 / 360)
    c = rows[CONVERGED]
    # converged: every run, decided on a (its own end: nothing saved)
    assert (c["runs"], c["decided"], c["agree"], c["false_pass"], c["steps_saved"]) == (4, 1, 4, 0, 0.0)
    assert rows[COLLAPSED]["decided"] == 0 and rows[COLLAPSED]["agreement"] == 1.0
    assert rule_table([])[0]["agreement"] is None


@pytest.mark.integration
def test_recorded_decisions_agree_with_the_recomputed_ones(tmp_path):
    """A real 6-step run with an evaluation every step and every early rule off: the trainer
    stores the rules' shadow decisions (plateaued must decide: a gain of 0.5 is needed to move
    the peak); recomputed from the stored evaluations they are the same, and `bench report
    --early` back-fills them once the stored rows are gone."""
    from bench.precision import Precision
    from bench.store import Run, RunDecision, open_store, session
    from runners.early_decisions import recompute, recorded
    from runners.runs import start_run
    from staleness_golden import base_config, make_build

    url = f"sqlite:///{tmp_path / 's.db'}"
    build = make_build(url)
    cfg = base_config()
    cfg.max_steps, cfg.eval_every, cfg.benchmarks = 6, 1, []
    cfg.stop.plateau, cfg.stop.collapse, cfg.stop.futility = False, False, False
    cfg.stop.patience, cfg.stop.min_delta, cfg.stop.futility_window = 2, 0.5, 3
    store = open_store(url)
    run_id = start_run(store, "pg-seq-is", Precision.parse("fp32"), cfg, build_id=build, ckpt_root=tmp_path / "c")
    with session(store) as s:
        run = s.get(Run, run_id)
        assert run.status in ("max_steps", CONVERGED) and run.step <= 6
        stored = recorded(s, run_id)
        assert stored[PLATEAUED][:2] == [2, PLATEAUED]          # steps 1 and 2 without a 0.5 gain
        assert stored == recompute(s, run)
        assert all(d.rule_on is False for d in s.scalars(select(RunDecision)) if d.rule != CONVERGED)
    r = CliRunner().invoke(app, ["report", "--early", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    before = json.loads(r.stdout)
    assert before["runs"][0]["source"] == "recorded"
    with session(store) as s:
        s.execute(delete(RunDecision))
    r = CliRunner().invoke(app, ["report", "--early", "--json", "--db", url])
    after = json.loads(r.stdout)
    assert after["runs"][0]["source"] == "recomputed"
    assert after["runs"][0]["decisions"] == before["runs"][0]["decisions"]
    drop = lambda rows: [{k: v for k, v in r.items() if k != "recomputed"} for r in rows]   # noqa: E731
    assert drop(after["rules"]) == drop(before["rules"]) and after["rules"][0]["recomputed"] == 1
    r = CliRunner().invoke(app, ["report", "--early", "--db", url])
    assert r.exit_code == 0 and "plateaued" in r.stdout and "recomputed" in r.stdout, r.output


def test_runs_from_before_the_table_are_back_filled(tmp_path):
    """A store at migration 0007 (no run_decisions) holding a finished run and its split
    evaluations: after the upgrade the run has no recorded decisions, and `bench report --early`
    recomputes them from the evaluations with the run's stored stop config (an old config: no
    futility keys, so futility is off and measured, plateau on)."""
    import sqlalchemy as sa

    from conftest import store_at_revision
    from runners.presets import tiny

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = store_at_revision(url, "0007")
    config = {"preset": "tiny", **json.loads(json.dumps(asdict(tiny())))}
    for k in ("futility", "futility_window", "futility_confidence", "plateau", "collapse"):
        config["stop"].pop(k)                       # what a run stored before those knobs existed
    with engine.begin() as c:
        c.execute(sa.text("UPDATE builds SET n_kept = 100 WHERE id = 'b1'"))
        c.execute(sa.text("INSERT INTO runs (id, model_id, build_id, algo, rollout_dtype, train_dtype, trainer, "
                          "engine, config, status, step, wall_s, staleness, created_at, updated_at) VALUES ('r1', 1, "
                          "'b1', 'pg-seq-is', 'fp16', 'fp16', 'native', 'torch', :c, 'plateaued', 55, 0, 0, "
                          "'2026-01-01', '2026-01-01')"), {"c": json.dumps(config)})
        # 0.5 at step 0, then flat at 0.80 (n = 100 problems × avg@4 = 400): the peak moves once (step 5),
        # so plateaued decides 10 evaluations later, at step 55
        for step in range(0, 60, 5):
            c.execute(sa.text("INSERT INTO evals (run_id, step, benchmark, n, score) VALUES ('r1', :s, 'split', 4, "
                              ":a)"), {"s": step, "a": 0.5 if step == 0 else 0.80})
    r = CliRunner().invoke(app, ["report", "--early", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    (run,) = out["runs"]
    assert run["source"] == "recomputed" and run["on"][FUTILE] is False and run["on"][PLATEAUED] is True
    assert run["decisions"][PLATEAUED][:2] == [55, PLATEAUED]
    # futile at step 50, the first window of 10 without the 0.5 of step 0 (at step 45 the rise from it
    #   projects far up): steps 5–50 flat at 0.80 over 400 samples each, x̄ = 27.5, horizon 150,
    #   se = √(0.16·(1/4,000 + 122.5²/(400·25·82.5))) = 0.054317, 0.80 + 1.644854·0.054317 = 0.889 < 0.95
    assert run["decisions"][FUTILE][:2] == [50, FUTILE]
    rules = {x["rule"]: x for x in out["rules"]}
    assert rules[FUTILE]["runs"] == 1 and rules[FUTILE]["agree"] == 1 and rules[PLATEAUED]["runs"] == 0
