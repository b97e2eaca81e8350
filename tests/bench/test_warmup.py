"""bench/warmup.py: the worked answers by hand, a training pool that never holds a problem of the
default build's draw, and a real warm-up (2 steps) of a tiny Llama written as GGUF: a model
directory whose `bench-model.json` records where it came from and whose defaults (prompt, source,
length) a build of it takes; the same settings give the same weights."""

import json

import pytest
import torch
from typer.testing import CliRunner

from bench.arithmetic import arithmetic_rows
from bench.model_sources import MODEL_FILE
from bench.warmup import WarmupConfig, training_pool, warmed_name, worked_answer
from gguf_files import tiny_llama, write_llama_gguf

pytest.importorskip("gguf")


def test_worked_answers_by_hand():
    assert worked_answer("What is 47 + 8?", "55") == "47 + 8 = 55. \\boxed{55}"
    assert worked_answer("What is 9 * 6?", "54") == "9 * 6 = 54. \\boxed{54}"
    assert worked_answer("Tom has 7 apples and gets 5 more. How many apples does Tom have now?", "12") == \
        "7 + 5 = 12. \\boxed{12}"
    assert worked_answer("Mia has 12 cards and gives away 3. How many cards does Mia have left?", "9") == \
        "12 - 3 = 9. \\boxed{9}"


def test_the_pool_never_holds_a_problem_of_the_default_build():
    held = {r["problem"] for r in arithmetic_rows("", 500, seed=0)}
    for seed in (0, 1):
        pool = training_pool(WarmupConfig(seed=seed))
        assert len(pool) > 1000 and not {r["problem"] for r in pool} & held
        assert {r["level"] for r in pool} == {2, 3, 4, 5}
        for r in pool[:200]:
            assert worked_answer(r["problem"], r["answer"]).endswith(f"\\boxed{{{r['answer']}}}")


def test_a_warm_up_writes_a_model_its_builds_prompt_like(tmp_path):
    from bench.models import build_defaults, load_model, resolve_model, warm_model

    path = write_llama_gguf(tmp_path / "tiny.gguf", tiny_llama(seed=2))
    cfg = WarmupConfig(steps=2, batch_size=4, lr=1e-3, threads=1, max_tokens=48)
    a = warm_model(str(path), cfg, tmp_path / "a")
    record = json.loads((tmp_path / "a" / MODEL_FILE).read_text())
    assert record["warmed_from"]["model_source"]["file"] == "tiny.gguf"
    assert record["warmup"]["steps"] == 2 and len(record["warmup"]["losses"]) == 2
    assert record["defaults"] == {"template": "chat", "instruction": "Please reason step by step, and put your final "
                                  "answer within \\boxed{}.", "base": False, "source": "arithmetic", "max_tokens": 48}
    ref = resolve_model(str(tmp_path / "a"))
    assert (ref.template, ref.instruction) == ("chat", record["defaults"]["instruction"])
    assert build_defaults(ref) == {"source": "arithmetic", "max_tokens": 48}
    before = load_model(resolve_model(str(path)))
    after = load_model(ref)
    assert not torch.equal(before.model.embed_tokens.weight, after.model.embed_tokens.weight)
    warm_model(str(path), cfg, tmp_path / "b")                     # the same settings: the same weights
    again = load_model(resolve_model(str(tmp_path / "b")))
    assert all(torch.equal(x, y) for x, y in zip(after.state_dict().values(), again.state_dict().values()))
    assert a["last_loss"] == json.loads((tmp_path / "b" / MODEL_FILE).read_text())["warmup"]["losses"][-1]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]      # no temporary directory left


def test_the_warmed_name_is_made_once_on_first_use(tmp_path, monkeypatch, capsys):
    """`smollm2-135m-warm` resolves to SmolLM2 warmed with the defaults under the name `bench model
    warmup` gives it: made on first use (its progress on stderr), found after (its base stood in by a
    tiny Llama here)."""
    import bench.model_sources as sources
    import bench.models as models

    path = write_llama_gguf(tmp_path / "tiny.gguf", tiny_llama(seed=2))
    monkeypatch.setenv("BENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(sources.WARMED, "tiny-warm", str(path))
    calls = []
    real = models.warm_model

    def small(name, cfg, out, progress=None):
        calls.append(out)
        return real(name, WarmupConfig(steps=1, batch_size=2, threads=1), out, progress)

    monkeypatch.setattr(models, "warm_model", small)
    ref = models.resolve_model("tiny-warm")
    assert ref.name == "tiny-warm" and calls == [tmp_path / "home" / "models" / warmed_name("tiny", WarmupConfig())]
    assert ref.path == str(calls[0].resolve()) and models.build_defaults(ref)["source"] == "arithmetic"
    assert models.resolve_model("tiny-warm").path == ref.path and len(calls) == 1
    assert "warm-up step 1/1: loss " in capsys.readouterr().err


def test_the_cli_refuses_what_it_cannot_warm_up(tmp_path):
    from bench.cli import app

    r = CliRunner().invoke(app, ["model", "warmup", "tiny-math"])
    assert r.exit_code == 2 and "bench model train" in r.output
    r = CliRunner().invoke(app, ["model", "warmup", str(tmp_path / "none.gguf")])
    assert r.exit_code == 2 and "no GGUF file" in r.output
    path = write_llama_gguf(tmp_path / "tiny.gguf", tiny_llama(seed=2))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    r = CliRunner().invoke(app, ["model", "warmup", str(path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "already holds a model" in r.output
    r = CliRunner().invoke(app, ["model", "warmup", str(path), "--levels", "7", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "levels are 1-5" in r.output


def test_what_check_and_mismatch_measure_on_by_model(tmp_path, monkeypatch):
    """The embedded models: synthetic-hard at 64 tokens; a warmed (or named) real model: its own
    arithmetic at its length; any other directory: synthetic-hard, at the caller's length."""
    from bench.models import measure_defaults, resolve_model, warm_model

    monkeypatch.setenv("BENCH_HOME", str(tmp_path / "home"))
    assert measure_defaults(resolve_model("tiny-math"), 1024) == {"source": "synthetic-hard", "max_tokens": 64}
    path = write_llama_gguf(tmp_path / "tiny.gguf", tiny_llama(seed=2))
    plain = resolve_model(str(path))
    assert measure_defaults(plain, 1024) == {"source": "synthetic-hard", "max_tokens": 1024}
    assert measure_defaults(plain) == {"source": "synthetic-hard", "max_tokens": 8192}
    warm_model(str(path), WarmupConfig(steps=1, batch_size=2, threads=1, max_tokens=40), tmp_path / "w")
    assert measure_defaults(resolve_model(str(tmp_path / "w")), 1024) == {"source": "arithmetic", "max_tokens": 40}
    with pytest.raises(Exception, match="already holds files"):          # never over a directory with files
        warm_model(str(path), WarmupConfig(steps=1, batch_size=2, threads=1), tmp_path / "w")
