"""`bench runs verify`: an untouched run re-runs bit-identical; a bundle whose step-2 reward (only)
was edited and resealed imports into a fresh store, then fails verify at step 2; on another CPU
kind the tolerance applied is stated; a verl run, another model's weights and bad input are
refused (exit 2, nothing stored); the comparison itself against hand-made windows; the pages
show the verification."""

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from bench.cli import app
from bench.kernels import cpu_kernel_path
from bench.store import Eval, Run, RunDigest, RunStep, RunVerification, open_store, session
from conftest import small_grpo_run
from runners import verify_compare as vc
from runners.verify import kind_text, recorded_kind, same_kind


def _cli(*args, env=None):
    return CliRunner(env=env).invoke(app, list(args))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A real 12-problem build and one real 3-step grpo fp32 run (evaluations at 0, 2, 3), exported."""
    tmp = tmp_path_factory.mktemp("verify")
    url, run_id = small_grpo_run(tmp, "--max-steps", "3", "--eval-every", "2")
    bundle = tmp / "bundle.tar.gz"
    assert _cli("runs", "export", run_id, "--out", str(bundle), "--db", url).exit_code == 0
    return {"url": url, "run": run_id, "bundle": bundle, "tmp": tmp}


def _rows(url):
    """What verify must leave alone: the run's steps, evaluations and row."""
    with session(open_store(url)) as s:
        steps = [(x.step, x.metrics) for x in s.scalars(select(RunStep).order_by(RunStep.run_id, RunStep.step))]
        evals = s.execute(select(Eval.run_id, Eval.step, Eval.benchmark, Eval.n, Eval.score)
                          .order_by(Eval.run_id, Eval.step, Eval.benchmark)).all()
        runs = [{c.name: getattr(r, c.name) for c in Run.__table__.columns} for r in s.scalars(select(Run))]
    return steps, evals, runs


def _verifications(url):
    with session(open_store(url)) as s:
        return [{c.name: getattr(v, c.name) for c in RunVerification.__table__.columns}
                for v in s.scalars(select(RunVerification).order_by(RunVerification.id))]


@pytest.mark.integration
def test_an_untouched_run_verifies_bit_identical(source):
    url, run_id = source["url"], source["run"]
    before = _rows(url)
    r = _cli("runs", "verify", run_id, "--db", url)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "verified 3 steps, bit-identical" in text and "re-ran steps 0–3" in text, text
    assert f"16-bit path {cpu_kernel_path()}" in text and "bit-identical required" in text
    assert _rows(url) == before                            # the run's own rows are not touched
    (v,) = _verifications(url)
    assert (v["run_id"], v["steps"], v["verdict"], v["differences"], v["tolerance"], v["first_difference"]) == \
        (run_id, 3, "bit-identical", 0, None, None)
    assert (v["device"], v["cpu_16bit"]) == ("cpu", cpu_kernel_path())
    from bench.provenance import git_commit

    assert v["bench_commit"] == git_commit()["commit"]
    # calibration fields, 3 steps' metrics and columns, the evaluations at steps 0, 2 and 3
    with session(open_store(url)) as s:
        n_metrics = sum(len(vc.step_values({c: getattr(x, c) for c in RunStep.COLUMNS}, x.metrics)) + 1
                        for x in s.scalars(select(RunStep).where(RunStep.run_id == run_id)))
        n_evals = s.scalar(select(func.count()).select_from(Eval).where(Eval.run_id == run_id))
        n_digests = s.scalar(select(func.count()).select_from(RunDigest).where(RunDigest.run_id == run_id))
        n_cal = len(s.get(Run, run_id).calibration)
    assert {e[1] for e in before[1]} == {0, 2, 3} and n_digests == 3        # a state digest at each evaluation
    assert v["compared"] == n_metrics + 2 * n_evals + n_cal + n_digests


def _members(bundle):
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _write_resealed(path, members):
    """The bundle with bundle.json's sums recomputed (a tamperer who knows the format)."""
    manifest = json.loads(members["bundle.json"])
    manifest["members"] = {n: hashlib.sha256(d).hexdigest() for n, d in members.items() if n != "bundle.json"}
    members = {**members, "bundle.json": json.dumps(manifest).encode()}
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _edited(source, tmp_path, edit):
    members = _members(source["bundle"])
    name = f"runs/{source['run']}.json"
    obj = json.loads(members[name])
    edit(obj)
    members[name] = json.dumps(obj).encode()
    return _write_resealed(tmp_path / "edited.tar.gz", members)


@pytest.mark.integration
def test_a_bundle_with_an_edited_step_2_reward_imports_then_fails_verify_at_step_2(source, tmp_path, db_url):
    """Into a fresh SQLite and a fresh PostgreSQL store."""
    def edit(o):
        (st,) = [x for x in o["steps"] if x["step"] == 2]
        st["reward"] = st["metrics"]["reward"] = st["reward"] + 0.25 if st["reward"] < 0.75 else st["reward"] - 0.25

    bundle = _edited(source, tmp_path, edit)
    url = db_url
    r = _cli("runs", "import", str(bundle), "--db", url)          # the checksums cannot tell
    assert r.exit_code == 0, r.output
    r = _cli("runs", "verify", source["run"], "--db", url)
    text = " ".join(r.stdout.split())
    assert r.exit_code == 1, r.output
    assert "DIFFERS at step 2, reward:" in text and "2 of" in text, text     # the metric and its column
    (v,) = _verifications(url)
    assert v["verdict"] == "differs" and v["differences"] == 2
    d = v["first_difference"]
    assert (d["step"], d["metric"]) == (2, "reward") and abs(d["stored"] - d["replayed"]) == 0.25


@pytest.mark.integration
def test_on_another_cpu_kind_the_tolerance_is_stated(source):
    url, run_id = source["url"], source["run"]
    other = "all" if cpu_kernel_path() != "all" else "none"
    r = _cli("runs", "verify", run_id, "--steps", "5", "--db", url, "--json", env={"BENCH_CPU_16BIT": other})
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["steps"] == 3 and doc["requested_steps"] == 5 and doc["same_kind"] is False
    assert doc["tolerance"] == vc.TOLERANCE_TEXT and doc["here"]["cpu_16bit"] == other
    assert doc["verdict"] in ("bit-identical", "within-tolerance")    # fp32: the 16-bit path moves nothing
    v = _verifications(url)[-1]
    assert (v["cpu_16bit"], v["tolerance"]) == (other, vc.TOLERANCE_TEXT)


def test_a_verl_run_says_why_it_cannot_be_verified_natively(tmp_path):
    from conftest import add_model_and_build

    url = f"sqlite:///{tmp_path / 's.db'}"
    with session(open_store(url)) as s:
        model_id = add_model_and_build(s)
        s.add(Run(id="v1", model_id=model_id, build_id="b0", algo="grpo", rollout_dtype="bf16", train_dtype="bf16",
                  trainer="verl", engine="vllm", config={"seed": 0}, status="max_steps", step=10))
    r = _cli("runs", "verify", "v1", "--db", url)
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2 and err.count("error:") == 1, r.output
    assert "trained by verl" in err and "cannot be verified here" in err, err
    assert _verifications(url) == []


@pytest.mark.integration
def test_another_models_weights_are_refused(source, tmp_path):
    bundle = _edited(source, tmp_path, lambda o: o["model"].update(weights_hash="0123456789abcdef"))
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _cli("runs", "import", str(bundle), "--db", url).exit_code == 0
    r = _cli("runs", "verify", source["run"], "--db", url)
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2 and "weights hash 0123456789abcdef" in err and "not the same weights" in err, err
    assert _verifications(url) == []


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [(["nope"], "no run 'nope'"), (["RUN", "--steps", "0"], "give at least 1")])
def test_bad_input_is_one_message(source, args, needle):
    url = source["url"]
    n = len(_verifications(url))
    r = _cli("runs", "verify", *[source["run"] if a == "RUN" else a for a in args], "--db", url)
    assert r.exit_code == 2 and needle in r.stderr, r.output
    assert len(_verifications(url)) == n


# ------------------------------------------------------------------ the comparison, by hand

def _window(**over):
    w = vc.Window(calibration={"k3": 1e-9, "ok": True},
                  steps={1: {"reward": 0.5, "reward (column)": 0.5, "kl_k3": 2e-3},
                         2: {"reward": 0.25, "reward (column)": 0.25, "kl_k3": 3e-3}},
                  evals={(0, "split"): (1, 0.4), (2, "split"): (1, 0.5)})
    for k, v in over.items():
        setattr(w, k, v)
    return w


def test_identical_windows_compare_bit_identical():
    r = vc.compare(_window(), _window(), 2, None)
    # calibration 2 + step markers 2 + metrics 6 + evals 2 × (n, score)
    assert (r["compared"], r["differences"], r["verdict"], r["first_difference"]) == (14, 0, "bit-identical", None)


def test_digests_of_another_scheme_are_not_comparable_and_say_so():
    """A run stored before digest scheme 2 (its digests hashed the process-wide RNG states): a
    re-run whose every value matches is bit-identical, its digests "not comparable (scheme 1)";
    a digest of the same scheme that differs is a difference; elsewhere none is compared."""
    stored = _window(digests={0: "a" * 64, 2: "b" * 64}, schemes={0: 1, 2: 1})
    replayed = _window(digests={0: "c" * 64, 2: "d" * 64})                  # this bench's scheme
    r = vc.compare(stored, replayed, 2, None)
    assert (r["verdict"], r["differences"], r["compared"], r["digests"]) == ("bit-identical", 0, 14,
                                                                            "not comparable (scheme 1)")
    same = _window(digests={0: "a" * 64, 2: "b" * 64})
    r = vc.compare(same, _window(digests={0: "a" * 64, 2: "b" * 64}), 2, None)
    assert (r["verdict"], r["compared"], r["digests"]) == ("bit-identical", 16, None)
    r = vc.compare(same, _window(digests={0: "a" * 64, 2: "e" * 64}), 2, None)
    assert r["verdict"] == "differs" and r["first_difference"] == {"step": 2, "metric": "state digest",
                                                                   "stored": "b" * 64, "replayed": "e" * 64}
    assert vc.compare(same, replayed, 2, vc.TOLERANCE)["digests"] == "not compared (another device or CPU kind)"
    # an old run resumed by this bench: step 0 of scheme 1, step 2 of scheme 2, only step 2 compared
    mixed = _window(digests={0: "a" * 64, 2: "d" * 64}, schemes={0: 1, 2: 2})
    r = vc.compare(mixed, replayed, 2, None)
    assert (r["verdict"], r["compared"], r["digests"]) == ("bit-identical", 15, "not comparable (scheme 1)")


def test_the_first_difference_in_step_order_and_the_tolerance():
    edited = _window()
    edited.steps = {1: {**edited.steps[1], "kl_k3": 2e-3 * (1 + 1e-5)}, 2: {**edited.steps[2], "reward": 0.5}}
    exact = vc.compare(_window(), edited, 2, None)
    assert exact["differences"] == 2 and exact["first_difference"] == {"step": 1, "metric": "kl_k3", "stored": 2e-3,
                                                                        "replayed": 2e-3 * (1 + 1e-5)}
    loose = vc.compare(_window(), edited, 2, vc.TOLERANCE)          # 1e-5 relative passes, 0.25 → 0.5 does not
    assert loose["differences"] == 1 and loose["exact_differences"] == 2
    assert loose["first_difference"] == {"step": 2, "metric": "reward", "stored": 0.25, "replayed": 0.5}
    only_kl = _window()
    only_kl.steps = {**only_kl.steps, 1: {**only_kl.steps[1], "kl_k3": 2e-3 * (1 + 1e-5)}}
    assert vc.compare(_window(), only_kl, 2, vc.TOLERANCE)["verdict"] == "within-tolerance"
    assert vc.compare(_window(), only_kl, 2, None)["verdict"] == "differs"


def test_reward_is_compared_first_within_a_step():
    edited = _window()
    edited.steps = {**edited.steps, 1: {"reward": 0.75, "reward (column)": 0.75, "kl_k3": 1.0}}
    assert vc.compare(_window(), edited, 2, None)["first_difference"]["metric"] == "reward"


def test_missing_steps_evals_and_calibration_are_differences_extra_metrics_are_not():
    no_step = _window(steps={1: _window().steps[1]})
    assert vc.compare(_window(), no_step, 2, None)["first_difference"] == {
        "step": 2, "metric": "step", "stored": "present", "replayed": vc.MISSING}
    assert vc.compare(no_step, _window(), 2, None)["first_difference"]["metric"] == "step"   # a stored step deleted
    extra_eval = _window(evals={**_window().evals, (1, "aime"): (1, 0.1)})
    assert vc.compare(_window(), extra_eval, 2, None)["first_difference"] == {
        "step": 1, "metric": "eval aime n", "stored": vc.MISSING, "replayed": 1}
    newer = _window(steps={s: {**m, "new_metric": 1.0} for s, m in _window().steps.items()},
                    calibration={**_window().calibration, "new_field": 2})
    assert vc.compare(_window(), newer, 2, None)["verdict"] == "bit-identical"
    assert vc.compare(_window(), _window(calibration=None), 2, None)["first_difference"]["metric"] == "calibration k3"
    # the window: step 2 and its evaluation are outside a 1-step window
    assert vc.compare(_window(), no_step, 1, None)["verdict"] == "bit-identical"


def test_the_machine_metrics_are_not_compared():
    values = vc.step_values({"reward": 0.5}, {"reward": 0.5, "time_rollout": 1.0, "tokens_per_s": 3.0,
                                             "train_tokens_per_s": 2.0, "wall_s": 9.0, "peak_memory_mb": 1.0,
                                             "loss": 0.1})
    assert {k for k in values if not k.endswith("(column)")} == {"reward", "loss"}


def test_same_kind_needs_every_fact_recorded_and_equal():
    here = {"device": "cpu", "device_name": None, "cpu_16bit": "none", "lowp_matmul_mode": "auto"}
    prov = {"device": "cpu", "device_name": "Some CPU", "cpu_16bit": "none", "lowp_matmul_mode": "auto"}
    assert same_kind(here, recorded_kind(prov))
    assert not same_kind(here, recorded_kind({**prov, "cpu_16bit": "bf16"}))
    assert not same_kind(here, recorded_kind({k: v for k, v in prov.items() if k != "cpu_16bit"}))  # older runs
    assert not same_kind(here, recorded_kind({**prov, "lowp_matmul_mode": "upcast"}))
    assert not same_kind(here, recorded_kind(None))
    gpu = {"device": "cuda:0", "device_name": "NVIDIA H200", "cpu_16bit": None, "lowp_matmul_mode": "auto"}
    assert same_kind(gpu, recorded_kind({"device": "cuda:0", "device_name": "NVIDIA H200", "lowp_matmul_mode": "auto"}))
    assert not same_kind(gpu, recorded_kind({"device": "cuda:0", "device_name": "NVIDIA A100",
                                             "lowp_matmul_mode": "auto"}))
    assert kind_text(here) == "cpu (16-bit path none)" and kind_text(gpu) == "cuda:0 (NVIDIA H200)"


# ------------------------------------------------------------------ the pages

@pytest.mark.integration
def test_the_leaderboard_and_run_page_show_the_verification(source, tmp_path):
    from streamlit.testing.v1 import AppTest

    url, run_id = source["url"], source["run"]
    if not _verifications(url):
        assert _cli("runs", "verify", run_id, "--steps", "1", "--db", url).exit_code == 0
    latest = _verifications(url)[-1]
    want = (f"verified {latest['steps']} steps, bit-identical" if latest["verdict"] == "bit-identical" else
            f"verified {latest['steps']} steps within {latest['tolerance']}")
    # the run (3 steps, UNDECIDED at its budget: its deciding window is its last 3 evaluations, 0–3)
    full = any(v["steps"] >= 3 and v["window_start"] == 0 and v["verdict"] != "differs" for v in _verifications(url))
    cell = "1/1 seeds verified (fully re-run)" if full else "0/1 seeds verified; weakest: first 1 of 3 steps re-run"
    os.environ["BENCH_DB_URL"] = url
    app_path = str(Path(__file__).parents[2] / "leaderboard" / "app.py")
    at = AppTest.from_file(app_path, default_timeout=120)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert list(at.dataframe[0].value.verification) == [cell]
    at.switch_page("pages/run.py")
    at.query_params["run"] = run_id
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    shown = [s.value for s in [*at.success, *at.info]]
    assert any(want in s and "deciding window: steps 1–3" in s for s in shown), shown


def test_verification_texts_by_hand():
    from leaderboard.verified import run_text

    ok = {"run": "a", "steps": 3, "verdict": "bit-identical", "tolerance": None, "first_difference": None}
    loose = {"run": "b", "steps": 2, "verdict": "within-tolerance", "tolerance": vc.TOLERANCE_TEXT,
             "first_difference": None}
    bad = {"run": "c", "steps": 3, "verdict": "differs", "tolerance": None,
           "first_difference": {"step": 2, "metric": "reward", "stored": 0.75, "replayed": 0.5}}
    assert run_text(ok) == "verified 3 steps, bit-identical" and run_text(None) == "not verified"
    assert run_text(loose) == "verified 2 steps within rel 1e-3 / abs 1e-6 (math.isclose)"
    assert run_text(bad) == "verify FAILED at step 2 (reward)"
    assert run_text({**bad, "tolerance": vc.TOLERANCE_TEXT}) == (
        "verify FAILED at step 2 (reward, re-run on another device or CPU kind)")


@pytest.mark.integration
def test_a_config_this_bench_cannot_read_is_one_message(source, tmp_path):
    bundle = _edited(source, tmp_path, lambda o: o["config"].update(a_setting_from_the_future=1))
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _cli("runs", "import", str(bundle), "--db", url).exit_code == 0
    r = _cli("runs", "verify", source["run"], "--db", url)
    assert r.exit_code == 2 and "config cannot be read by this bench" in r.stderr, r.output
    assert _verifications(url) == []


def test_the_message_names_the_criterion_and_what_else_can_explain_a_difference():
    from bench.cli.runs import _verify_text

    here = {"device": "cpu", "device_name": None, "cpu_16bit": "all", "lowp_matmul_mode": "auto"}
    base = {"run": "r1", "steps": 3, "requested_steps": 3, "here": here, "recorded": {**here, "cpu_16bit": "none"},
            "same_kind": False, "tolerance": vc.TOLERANCE_TEXT, "compared": 200, "differences": 2,
            "exact_differences": 2, "verdict": "differs", "bench_recorded": "a" * 40, "bench_here": "b" * 40,
            "first_difference": {"step": 2, "metric": "reward", "stored": 0.75, "replayed": 0.5}}
    text = _verify_text(base)
    assert "re-ran steps 0–3 on cpu (16-bit path all)" in text
    assert "the run recorded cpu (16-bit path none), so each number must agree within rel 1e-3 / abs 1e-6" in text
    assert "DIFFERS at step 2, reward: stored 0.75, re-run 0.5 (2 of 200 values differ)" in text
    assert "does not show tampering" in text and "made by bench aaaaaaaaaaaa, this is bbbbbbbbbbbb" in text
    same = _verify_text({**base, "same_kind": True, "tolerance": None, "bench_here": "a" * 40,
                         "recorded": here})
    assert "bit-identical required" in same and "tampering" not in same and "made by bench" not in same
    ok = _verify_text({**base, "verdict": "within-tolerance", "differences": 0, "first_difference": None})
    assert ok.endswith("verified 3 steps within tolerance (2 values differ in their last digits)")


@pytest.mark.integration
def test_a_row_claiming_fewer_steps_than_it_stores_hides_none(source, tmp_path):
    """A stored row edited to claim fewer steps than it stores (in the store: a bundle claiming so is
    refused at import, its max_steps status then unsupported by its evaluations)."""
    def edit(o):
        (st,) = [x for x in o["steps"] if x["step"] == 2]
        st["metrics"]["kl_k3"] = 0.0
        o["step"] = 1

    refused = _edited(source, tmp_path, edit)
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    r = _cli("runs", "import", str(refused), "--db", url)
    assert r.exit_code == 2 and "is not supported by its evaluations" in " ".join(r.stderr.split()), r.output
    bundle = _edited(source, tmp_path, lambda o: [x for x in o["steps"] if x["step"] == 2][0]["metrics"].update(
        kl_k3=0.0))
    assert _cli("runs", "import", str(bundle), "--db", url).exit_code == 0
    with session(open_store(url)) as s:
        s.get(Run, source["run"]).step = 1
    r = _cli("runs", "verify", source["run"], "--db", url)
    assert r.exit_code == 1 and "DIFFERS at step 2, kl_k3:" in " ".join(r.stdout.split()), r.output


@pytest.mark.integration
def test_a_run_that_ended_at_step_0_can_be_planned(source, tmp_path):
    """A run the calibration gate stopped stores no step: a verification re-runs its calibration
    (window 0–0), it is not refused as "none after step 0"."""
    import sqlite3

    from runners.verify import plan_verification

    db = tmp_path / "copy.db"
    with sqlite3.connect(source["url"][len("sqlite:///"):]) as src, sqlite3.connect(db) as dst:
        src.backup(dst)                           # the store is in WAL mode: a file copy can miss its last writes
    url = f"sqlite:///{db}"
    with session(open_store(url)) as s:
        run = s.get(Run, source["run"])
        run.step, run.status = 0, "miscalibrated"
        s.query(RunStep).filter(RunStep.run_id == run.id).delete()
    plan = plan_verification(open_store(url), source["run"], 3)
    assert (plan.start, plan.last_step) == (0, 0)
