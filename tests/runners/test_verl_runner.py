"""The verl runner's configuration: overrides per algorithm × precision as in
docs/verl.md, verl's parquet, the reward module on real golds, the metric name map.
verl's own checks (Hydra compose, `validate_config`, `main_ppo --cfg job`) run in verl's
environment; the losses are checked against verl's in test_verl_crosscheck.py."""

import json
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.precision import ALL_PAIRS, CLASSIC_PAIRS, Precision
from bench.problems import Problem
from bench.store import Build, Run, open_store, session
from bench.algorithms import PAPER_ALGORITHMS
from runners.algos import REGISTRY
from runners.presets import get_preset
from runners.verl_runner import (NOT_ON_VERL, ON_VERL, VerlError, VerlJob, algo_overrides, check_verl_version,
                                 export_parquet, map_metrics, validate_cells, verl_command)


def kv(overrides):
    return dict(o.split("=", 1) for o in overrides)


def test_every_cell_has_the_reference_keys(tmp_path):
    cfg = get_preset("paper")
    job = VerlJob("/m", tmp_path / "t.parquet", None, tmp_path / "r.py", tmp_path / "m.jsonl", "p", "e")
    for algo in ON_VERL:
        for p in CLASSIC_PAIRS:          # the paper's nine pairs; formats below 16 bits: test_low_bit_cells
            argv, env = verl_command(algo, p, cfg, job)
            o = kv(argv[3:])
            assert argv[:3] == ["python", "-m", "verl.trainer.main_ppo"]
            assert (o["algorithm.adv_estimator"] == "rloo"
                    and o["actor_rollout_ref.rollout.calculate_log_probs"] == "True")
            assert o["actor_rollout_ref.rollout.dtype"] == {"fp32": "float32", "fp16": "float16",
                                                            "bf16": "bfloat16"}[p.rollout]
            assert o["+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"] == p.train
            assert env["VERL_FILE_LOGGER_PATH"].endswith("m.jsonl")
            if algo != "gspo":      # Dr.GRPO aggregation with an explicit normaliser
                assert o["actor_rollout_ref.actor.loss_scale_factor"] == "8192"
                assert o["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-sum-norm"


def test_low_bit_cells(tmp_path):
    """fp8 rollouts map to verl's own vLLM fp8 (bf16 + quantization=fp8); every other pair with
    a format verl 0.9.1 cannot express (int8, bf16+head32, fp8 training) is refused with one
    message naming the native trainer."""
    from runners.verl_runner import precision_overrides

    cfg = get_preset("paper")
    job = VerlJob("/m", tmp_path / "t.parquet", None, tmp_path / "r.py", tmp_path / "m.jsonl", "p", "e")
    expressible = []
    for p in ALL_PAIRS:
        if p in CLASSIC_PAIRS:
            continue
        if p.rollout == "fp8" and p.train in ("fp32", "bf16", "fp16"):
            o = kv(verl_command("grpo", p, cfg, job)[0][3:])
            assert o["actor_rollout_ref.rollout.dtype"] == "bfloat16"
            assert o["actor_rollout_ref.rollout.quantization"] == "fp8"
            assert o["+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"] == p.train
            expressible.append(p)
            continue
        with pytest.raises(VerlError, match=r"verl 0\.9\.1 cannot run .*run this cell with the native trainer"):
            precision_overrides(p)
    assert len(expressible) == 3
    assert "quantization" not in " ".join(precision_overrides(Precision("bf16", "bf16")))
    with pytest.raises(VerlError, match="no fp8 training"):
        precision_overrides(Precision("fp8", "fp8"))
    with pytest.raises(VerlError, match="int8 rollout"):
        precision_overrides(Precision("int8", "fp32"))
    with pytest.raises(VerlError, match="fp32 lm_head"):
        precision_overrides(Precision("bf16", "bf16+head32"))


@pytest.mark.verl
@pytest.mark.integration
def test_fp8_rollout_cells_pass_verls_validate_config(tmp_path, verl_python):
    cfg = get_preset("paper")
    job = VerlJob("/m", tmp_path / "t.parquet", None, tmp_path / "r.py", tmp_path / "m.jsonl", "p", "e")
    cells = [verl_command(a, Precision("fp8", t), cfg, job)[0][3:] for a, t in
             (("pg-seq-mis", "bf16"), ("grpo", "fp32"), ("gspo", "fp16"))]
    assert validate_cells(verl_python, cells) == [None, None, None]


def test_pg_family_uses_bypass_mode_explicitly_and_quotes_lo_hi():
    o = kv(algo_overrides("pg-seq-mis", 8192))
    assert o["actor_rollout_ref.actor.policy_loss.loss_mode"] == "bypass_mode"
    assert o["algorithm.rollout_correction.loss_type"] == "reinforce"
    assert o["algorithm.rollout_correction.rollout_is_threshold"] == "'1e-9_3'"
    assert o["+actor_rollout_ref.actor.policy_loss.rollout_correction"] == "${algorithm.rollout_correction}"
    assert kv(algo_overrides("pg-seq-is", 64))["algorithm.rollout_correction.rollout_is_threshold"] == "1e30"
    assert kv(algo_overrides("pg-seq-tis", 64))["algorithm.rollout_correction.rollout_is_threshold"] == "3"
    assert kv(algo_overrides("grpo-seq-mis", 64))["algorithm.rollout_correction.rollout_is_threshold"] == "'1e-9_3'"
    g = kv(algo_overrides("gspo", 64))
    assert g["actor_rollout_ref.actor.clip_ratio_low"] == "3e-4" and "loss_scale_factor" not in " ".join(g)
    assert kv(algo_overrides("grpo", 64))["actor_rollout_ref.actor.clip_ratio_high"] == "0.28"
    with pytest.raises(VerlError):
        algo_overrides("ppo", 64)


def test_each_correction_maps_onto_verls_keys_or_is_refused_by_name():
    """verl has rules for icepop (token IS, "lo_hi"), trm and the geometric mask (rollout_rs) and both
    CISPOs (loss_mode=cispo); the others are refused before anything is written, saying why."""
    from bench.algorithms import ALGO_GROUPS, AlgoConfig
    from runners.verl_launch import check_verl_cell

    rc = "algorithm.rollout_correction."
    o = kv(algo_overrides("icepop", 64))
    assert o[rc + "rollout_is"] == "token" and o[rc + "rollout_is_threshold"] == "'0.5_5'"
    assert o["actor_rollout_ref.actor.clip_ratio_c"] == "1e9" and "bypass_mode" not in o
    assert kv(algo_overrides("trm", 64))[rc + "rollout_rs"] == "seq_max_k2"
    assert kv(algo_overrides("trm", 64, algo_cfg=AlgoConfig(trm_k2=0.05)))[rc + "rollout_rs_threshold"] == "0.05"
    g = kv(algo_overrides("grpo-geo-mask", 64))
    assert g[rc + "rollout_rs"] == "seq_mean_k1" and g[rc + "rollout_rs_threshold"] == "'0.999_1.001'"
    c = kv(algo_overrides("cispo", 64))
    assert c["actor_rollout_ref.actor.policy_loss.loss_mode"] == "cispo"
    assert (c["actor_rollout_ref.actor.clip_ratio_low"], c["actor_rollout_ref.actor.clip_ratio_high"]) == ("1.0", "4")
    c2 = kv(algo_overrides("cispo-two-sided", 64))
    assert (c2["actor_rollout_ref.actor.clip_ratio_low"], c2["actor_rollout_ref.actor.clip_ratio_high"]) == ("0.2",
                                                                                                          "0.28")
    refused = [a for a in ALGO_GROUPS["corrections"] if a in NOT_ON_VERL]
    assert refused == ["pg-icepop", "dppo-tv", "dppo-kl", "ipo", "opsm", "opsm-old", "sc"]
    for a in refused:
        with pytest.raises(VerlError, match=f"^{a} runs on the native trainer only .*verl 0.9.1"):
            check_verl_cell(a, get_preset("paper"))
        with pytest.raises(VerlError, match=a):
            algo_overrides(a, 64)


def test_version_check():
    check_verl_version("0.9.1")
    with pytest.raises(VerlError, match="written for verl 0.9.1"):
        check_verl_version("0.7.0")
    with pytest.raises(VerlError, match="not installed"):
        check_verl_version(None)


def test_parquet_rows(tmp_path):
    path = export_parquet([Problem("a", "What is 1+1?", "2")], tmp_path / "t.parquet", "bench/b1")
    row = pd.read_parquet(path).iloc[0]
    assert row.data_source == "bench/b1" and row.ability == "math"
    assert list(row.prompt)[0]["role"] == "user" and "\\boxed{}" in list(row.prompt)[0]["content"]
    assert row.reward_model["ground_truth"] == "2" and row.extra_info["id"] == "a"


@pytest.mark.integration
def test_reward_module_grades_real_golds(shared_data):
    from runners.verl_reward import compute_score

    rows = [json.loads(line) for line in open(f"{shared_data}/math500.jsonl")][:20]
    for r in rows:
        good = compute_score("math500", f"so the answer is \\boxed{{{r['answer']}}}", r["answer"])
        assert good == {"score": 1.0, "acc": True, "pred": r["answer"].strip()}
        bad = compute_score("math500", "I give up", r["answer"])
        assert bad["score"] == 0.0 and bad["acc"] is False


def test_metric_names():
    m = map_metrics({"critic/score/mean": 0.5, "rollout_corr/k3_kl": 1e-4, "val-core/aime24/acc/mean@32": 0.3,
                     "actor/entropy": 1.2, "rollout_corr/kl": 2e-5, "rollout_corr/rollout_is_mean": 0.9})
    assert m == {"reward": 0.5, "kl_k3": 1e-4, "eval/aime24": 0.3, "verl/actor/entropy": 1.2,
                 "kl_k1_token": 2e-5, "is_weight_applied_mean": 0.9}   # per-token kl; applied (truncated) weights


@pytest.mark.integration
def test_pg_seq_mis_is_refused_for_verl_before_launch(tmp_path):
    """verl 0.9.1 dies mid-run on pg-seq-mis (compute_is_metrics divides by zero when IcePop drops
    every sequence of a micro-batch: tests/runners/test_verl_crosscheck.py and test_verl_metrics.py show it
    in verl's own code), so bench refuses it before launching anything, for run and sweep; `--algo
    all` with verl leaves it out and says so."""
    from bench.cli import app

    url = f"sqlite:///{tmp_path / 's.db'}"
    assert CliRunner().invoke(app, ["build", "--limit", "8", "--k", "2", "--engine", "torch", "--band", "0", "1",
                                    "--db", url]).exit_code == 0
    for verb in ("run", "sweep"):
        r = CliRunner().invoke(app, [verb, "--trainer", "verl", "--algo", "pg-seq-mis", "--dtype", "bf16",
                                     "--dry-run" if verb == "run" else "--jobs", *([] if verb == "run" else ["1"]),
                                     "--db", url])
        text = " ".join(r.output.split())
        assert r.exit_code == 2 and "pg-seq-mis runs on the native trainer only" in text, (verb, r.output)
        assert "ZeroDivisionError" in text
    with session(open_store(url)) as s:
        assert s.scalars(select(Run)).all() == []


@pytest.mark.slow
def test_dry_run_cli(tmp_path):
    from bench.cli import app

    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(app, ["build", "--limit", "16", "--k", "4", "--engine", "torch", "--band", "0", "1",
                                 "--db", url])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--dtype", "bf16", "--dry-run",
                                 "--db", url])
    assert r.exit_code == 0, r.output
    assert "verl.trainer.main_ppo" in r.stdout and "actor_rollout_ref.rollout.dtype=bfloat16" in r.stdout
    assert "not validated" in r.stderr                          # this interpreter has no verl
    # verl's follower applies the stop rules' switches: no warning for them; one for a native knob
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--dtype", "bf16", "--dry-run",
                                 "--no-futility", "--plateau", "--futility-window", "5", "--db", url])
    assert r.exit_code == 0 and "does not take" not in r.stderr, r.stderr
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--dtype", "bf16", "--dry-run",
                                 "--no-futility", "--threads", "2", "--db", url])
    assert "verl does not take --threads (native trainer settings)" in " ".join(r.stderr.split())
    # the dry run: one command per seed, each with the seed in verl's seeds and the user's overrides
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--dtype", "bf16", "--dry-run",
                                 "--seeds", "0,1", "--verl-override", "data.max_prompt_length=2048",
                                 "--verl-override", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                                 "--db", url])
    assert r.exit_code == 0, r.output
    commands = [line.split() for line in r.stdout.splitlines() if "verl.trainer.main_ppo" in line]
    assert len(commands) == 2
    for seed, words in enumerate(commands):
        assert f"data.seed={seed}" in words and f"actor_rollout_ref.rollout.seed={seed}" in words
        assert "data.max_prompt_length=2048" in words and "data.max_prompt_length=1024" not in words
        assert words[-1] == "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    for args, why in ((["--verl-override", "actor_rollout_ref.actor.optim.lr=1e-6"], "from --lr"),
                      (["--keep-checkpoints", "5"], "re-runs native runs only"),
                      (["--trainer", "native", "--verl-override", "a.b=1"], "give --trainer verl"),
                      (["--resume", "abc", "--verl-override", "a.b=1"], "a resumed run keeps its stored command")):
        r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--dry-run", *args, "--db", url])
        assert r.exit_code == 2 and why in " ".join(r.output.split()), r.output
    r = CliRunner().invoke(app, ["sweep", "--trainer", "verl", "--algo", "grpo", "--dtype", "bf16",
                                 "--keep-checkpoints", "5", "--db", url])
    assert r.exit_code == 2 and "re-runs native runs only" in " ".join(r.output.split())   # not dropped silently
    # a pair verl has no format for is refused by the plan, before a run directory is made
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--dtype", "rollout=int8,train=bf16",
                                 "--db", url])
    assert r.exit_code == 2 and "int8 rollout" in r.output, r.output
    assert {p.name for p in (tmp_path / "bench_home" / "verl").iterdir()} == {"dry-run"}
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--db", url])
    assert r.exit_code == 2 and "verl is not installed" in r.output
    with session(open_store(url)) as s:
        assert s.scalars(select(Run)).all() == []               # nothing half-written


@pytest.mark.verl
@pytest.mark.integration
def test_dry_run_is_validated_by_verl(tmp_path, verl_python):
    from bench.cli import app

    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(app, ["build", "--limit", "16", "--k", "4", "--engine", "torch", "--band", "0", "1",
                                 "--db", url])
    assert r.exit_code == 0, r.output
    args = ["run", "--trainer", "verl", "--algo", "gspo", "--dtype", "fp16", "--dry-run", "--verl-python", verl_python,
            "--db", url]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "validate_config passed" in r.stderr and "loss_mode=gspo" in r.stdout
    r = CliRunner().invoke(app, args + ["--prompts-per-step", "2", "--updates-per-batch", "1", "--gpus", "3"])
    assert r.exit_code == 2 and "validate_config rejects" in r.output
    # verl's own validate_config takes the seeds bench passes and the user's overrides
    r = CliRunner().invoke(app, args + ["--seeds", "0,1", "--verl-override", "data.max_prompt_length=2048",
                                        "--verl-override", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    assert r.exit_code == 0 and r.stderr.count("validate_config passed (seed") == 2, r.output


@pytest.fixture(scope="module")
def dry_run_cells(tmp_path_factory, shared_data):
    """What `bench run --trainer verl --preset paper --dry-run` prints for each of the 59 cells (the paper's
    six verl algorithms × 9 pairs, pg-seq-mis refused; the five corrections verl has at bf16),
    split back into the overrides (env assignment and `python -m verl.trainer.main_ppo` dropped)."""
    import shlex

    from bench.cli import app

    shared = Path(shared_data)
    home = tmp_path_factory.mktemp("home")
    url = f"sqlite:///{home / 's.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("BENCH_HOME", str(home))
    try:
        r = CliRunner().invoke(app, ["build", "--limit", "16", "--k", "4", "--engine", "torch", "--band", "0", "1",
                                     "--db", url])
        assert r.exit_code == 0, r.output
        cells = {}
        for a in (a for a in REGISTRY if a not in NOT_ON_VERL):       # refused for verl (tests below)
            for p in (CLASSIC_PAIRS if a in PAPER_ALGORITHMS else [Precision("bf16", "bf16")]):
                r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", a, "--dtype",
                                             f"rollout={p.rollout},train={p.train}", "--preset", "paper", "--dry-run",
                                             "--benchmark", str(shared / "aime24.jsonl"), "--db", url])
                assert r.exit_code == 0, r.output
                words = shlex.split(r.stdout)
                assert words[0].startswith("VERL_FILE_LOGGER_PATH=") and words[2:4] == ["-m", "verl.trainer.main_ppo"]
                cells[(a, p.name)] = words[4:]
        vals = list(home.glob("verl/dry-run/*/val.parquet"))
        assert len(vals) == 59 and len(pd.read_parquet(vals[0])) == 30            # AIME24 from --benchmark
    finally:
        mp.undo()
    return cells


@pytest.mark.verl
@pytest.mark.integration
def test_every_dry_run_passes_verls_validate_config(dry_run_cells, verl_python):
    """Hydra compose + `validate_config` + the config dataclasses, as main_ppo runs them before
    Ray starts, on the printed --dry-run command of the 6 verl algorithms × 9 precision pairs and the 5
    corrections verl has (icepop, trm, grpo-geo-mask, cispo, cispo-two-sided) at bf16; and a broken
    override is caught."""
    cells = list(dry_run_cells)
    overrides = [dry_run_cells[c] for c in cells]
    bad = ([o for o in overrides[0] if "ppo_mini_batch_size=" not in o]
           + ["actor_rollout_ref.actor.ppo_mini_batch_size=128"])
    errors = validate_cells(verl_python, overrides + [bad])
    assert len(cells) == 59 and [(c, e) for c, e in zip(cells, errors) if e] == []
    assert errors[-1] == "ValueError: train_batch_size (64) must be >= actor.ppo_mini_batch_size (128)"


# Composes the given cells' overrides with verl's own Hydra config, as `main_ppo --cfg job` does
# (the same config directory and name, the same override grammar and strictness), in one process.
_COMPOSE = """
import importlib.util, json, os, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
trainer = importlib.util.find_spec("verl.trainer").submodule_search_locations[0]
out = {}
with initialize_config_dir(config_dir=os.path.join(trainer, "config"), version_base=None):
    for key, overrides in json.load(sys.stdin):
        try:
            out[key] = [0, OmegaConf.to_yaml(compose("ppo_trainer", overrides=overrides))]
        except Exception as e:
            out[key] = [1, f"{type(e).__name__}: {e}"[-500:]]
print(json.dumps(out))
"""


@pytest.mark.verl
@pytest.mark.integration
def test_every_dry_run_composes_with_verls_own_main_ppo(dry_run_cells, verl_python):
    """The cells' overrides compose with verl's own config in verl's environment (./bench.sh test
    makes .venv-verl) with Hydra's compose API, to the values bench means; and one cell through
    `python -m verl.trainer.main_ppo --cfg job` itself prints the same job config, so the two
    ways cannot drift apart (63 launches of main_ppo took ~10 min of CI when each cell launched
    it). That all 54 compose is the test above's first step (runners/verl_check.py composes each
    cell so before validating it); here the four cells whose values are read (~0.7 s a compose)."""
    import subprocess

    read = [("grpo-seq-mis", "fp16"), ("pg-seq-is", "bf16"), ("gspo", "fp32"), ("grpo", "bf16")]
    cells = [(f"{a}|{p}", dry_run_cells[(a, p)]) for a, p in read]
    r = subprocess.run([verl_python, "-c", _COMPOSE], input=json.dumps(cells), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(results) == 4 and [(k, out) for k, (rc, out) in results.items() if rc] == []
    out = {tuple(k.split("|")): o for k, (_, o) in results.items()}
    assert "rollout_is_threshold: '1e-9_3'" in out[("grpo-seq-mis", "fp16")]
    assert "loss_mode: bypass_mode" in out[("pg-seq-is", "bf16")]
    assert "loss_mode: gspo" in out[("gspo", "fp32")]
    assert "adv_estimator: rloo" in out[("grpo", "bf16")]
    main = subprocess.run([verl_python, "-m", "verl.trainer.main_ppo", *dry_run_cells[("pg-seq-is", "bf16")],
                           "--cfg", "job"], capture_output=True, text=True, timeout=300)
    assert main.returncode == 0, main.stderr[-500:]
    assert main.stdout.strip() == out[("pg-seq-is", "bf16")].strip()


@pytest.mark.verl
@pytest.mark.integration
def test_launch_refuses_a_verl_without_its_trainer_dependencies(tmp_path, verl_python):
    """A base `pip install verl` (this CI's) lacks TransferQueue and vLLM: main_ppo would start
    Ray and then fail in the TaskRunner; bench says so before launching and writes no run."""
    from bench.cli import app

    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(app, ["build", "--limit", "8", "--k", "2", "--engine", "torch", "--band", "0", "1",
                                 "--db", url])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--verl-python", verl_python,
                                 "--db", url])
    assert r.exit_code == 2 and "TransferQueue" in r.output and "verl[vllm]" in " ".join(r.output.split())
    with session(open_store(url)) as s:
        assert s.scalars(select(Run)).all() == []


def test_the_preset_benchmark_can_be_pointed_at_a_file():
    assert get_preset("paper").benchmarks[0].source == "aime24"           # the hub alias
    b = get_preset("paper", benchmark="/data/aime24.jsonl").benchmarks[0]
    assert (b.name, b.source, b.n, b.temperature, b.top_p) == ("aime24", "/data/aime24.jsonl", 32, 0.6, 0.95)
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope", benchmark="x")


@pytest.mark.verl
@pytest.mark.integration
def test_sweep_with_verl_runs_each_cell_through_bench_run(tmp_path, verl_python):
    """`bench sweep --trainer verl` runs the cells one by one through `bench run --trainer verl`;
    a cell finished by the native trainer is not taken for a verl result. Here every cell is
    refused before launch (this verl lacks TransferQueue) and the grid says why, per cell."""
    from bench.cli import app
    from bench.precision import Precision
    from bench.statuses import FINISHED
    from runners.sweep import cell_runs

    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(app, ["build", "--limit", "8", "--k", "2", "--engine", "torch", "--band", "0", "1",
                                 "--db", url])
    assert r.exit_code == 0, r.output
    store = open_store(url)
    r = CliRunner().invoke(app, ["sweep", "--algo", "grpo,gspo", "--dtype", "bf16", "--trainer", "verl",
                                 "--verl-python", verl_python, "--gpus", "2", "--db", url])
    assert r.exit_code == 1
    text = " ".join(r.output.split())
    assert (text.count("has verl but not TransferQueue") == 2 and "grpo bf16 failed" in text
            and "gspo bf16 failed" in text)
    with session(store) as s:
        assert s.scalars(select(Run)).all() == []
        b = s.scalars(select(Build)).one()
        s.add(Run(id="n1", model_id=b.model_id, build_id=b.id, algo="grpo", rollout_dtype="bf16", train_dtype="bf16",
                  trainer="native", engine="torch", config={}, status="converged"))
    with session(store) as s:
        p = Precision.parse("bf16")
        def finished(trainer):
            return [r.id for r in cell_runs(s, b.id, "grpo", p, trainer, 0, None, None, FINISHED)]

        assert finished("native") == ["n1"] and finished("verl") == []


def test_verl_refuses_the_tiny_preset_for_a_real_model(tmp_path):
    """The tiny preset (lr 1e-3, 64 tokens) is refused for a model other than the embedded ones on
    verl as on the native trainer, before anything is written."""
    from bench.cli import app
    from bench.store import Model

    url = f"sqlite:///{tmp_path / 's.db'}"
    with session(open_store(url)) as s:
        m = Model(name="my-org/my-1b", path=str(tmp_path / "my-1b"), weights_hash="h")
        s.add(m)
        s.flush()
        s.add(Build(id="b1", model_id=m.id, source="math", engine="vllm", dtype="bf16", k=8, lo=0.2, hi=0.8, seed=0,
                    settings_hash="h", status="complete", n_problems=1, n_kept=1))
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "grpo", "--dtype", "bf16", "--dry-run",
                                 "--preset", "tiny", "--db", url])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "preset 'tiny' is made for the embedded tiny-math models" in text, r.output
    assert not (tmp_path / "bench_home" / "verl").exists()            # no run directory either
    with session(open_store(url)) as s:
        assert s.scalars(select(Run)).all() == []


def test_the_preset_follows_the_model_and_the_device(tmp_path):
    """No --preset: tiny for the embedded tiny-math models, small for another model on a CPU, paper
    on a GPU (and so for verl)."""
    from bench.store import Model
    from conftest import add_model_and_build
    from runners.plan import default_preset

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    with session(store) as s:
        add_model_and_build(s, "b0")
        m = Model(name="my-org/my-1b", path=str(tmp_path / "my-1b"), weights_hash="h2")
        s.add(m)
        s.flush()
        s.add(Build(id="b1", model_id=m.id, source="math", engine="vllm", dtype="bf16", k=8, lo=0.2, hi=0.8, seed=0,
                    settings_hash="h", status="complete", n_problems=1, n_kept=1))
    assert [default_preset(store, "b0", None, d) for d in ("cpu", "cuda:0")] == ["tiny", "tiny"]
    assert [default_preset(store, "b1", None, d) for d in ("cpu", "cuda", "cuda:1")] == ["small", "paper", "paper"]
    assert default_preset(store, None, "my-org/my-1b", "cpu") == "small"


def test_a_verl_launch_is_typed_and_an_old_stored_one_still_reads():
    """runs.config["verl"] is a VerlLaunch (its target a typed field); a run stored before (the dict
    prepare() returned, no target) reads back with the interpreter, GPUs and nodes of its command."""
    import json

    from runners.verl_follow import VerlLaunch
    from runners.verl_runner import VerlTarget

    argv = ["/envs/verl/bin/python", "-m", "verl.trainer.main_ppo", "trainer.n_gpus_per_node=8", "trainer.nnodes=2",
            "data.seed=0"]
    launch = VerlLaunch("r1", "/h/verl/r1", argv, {"VERL_FILE_LOGGER_PATH": "/h/verl/r1/metrics.jsonl"}, "b1", 3, 120,
                        VerlTarget("/envs/verl/bin/python", 8, 2))
    stored = json.loads(json.dumps(launch.to_config()))                  # as the store keeps it
    assert stored["target"] == {"python": "/envs/verl/bin/python", "gpus": 8, "nodes": 2}
    assert VerlLaunch.from_config(stored) == launch
    old = {k: v for k, v in stored.items() if k != "target"}             # before 2026-12-05
    assert VerlLaunch.from_config(old) == launch
    assert VerlLaunch.from_config({**old, "argv": argv[:3]}).target == VerlTarget("/envs/verl/bin/python", 1, 1)
