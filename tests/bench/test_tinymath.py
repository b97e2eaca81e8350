"""The embedded model: the training script on a shrunken config, and the shipped weights."""

import json

from typer.testing import CliRunner

from bench.cli import app
from bench.models import TINY_MATH_DIR, TINY_MATH_MOE_DIR, resolve_model, weights_hash


def test_training_script_on_a_shrunken_config(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "tm"
    r = CliRunner().invoke(app, ["model", "train", "tiny-math", "--steps", "3", "--batch-size", "4",
                                 "--hidden", "32", "--layers", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["steps"] == 3 and summary["parameters"] < 50_000
    tok = AutoTokenizer.from_pretrained(out)          # the character tokenizer survives a round trip
    text = "Q: Compute 3+4.\nA: 3+4=7. \\boxed{7}"
    assert tok.tokenize(text) == list(text) and tok.decode(tok.encode(text)) == text
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.tie_word_embeddings and model.config.hidden_size == 32


def test_shipped_weights_are_small_and_resolvable():
    ref = resolve_model("tiny-math")
    assert ref.embedded and ref.template == "plain"
    size = sum(f.stat().st_size for f in TINY_MATH_DIR.iterdir())
    assert size < 5 * 1024 * 1024
    assert len(weights_hash(ref)) == 16


def test_unknown_trainable_model():
    r = CliRunner().invoke(app, ["model", "train", "gpt2"])
    assert r.exit_code == 2 and "only 'tiny-math' or 'tiny-math-moe'" in r.output


def test_shipped_moe_weights_are_small_and_resolvable():
    ref = resolve_model("tiny-math-moe")
    assert ref.embedded and ref.template == "plain" and ref.path == str(TINY_MATH_MOE_DIR)
    assert sum(f.stat().st_size for f in TINY_MATH_MOE_DIR.iterdir()) < 5 * 1024 * 1024
    assert len(weights_hash(ref)) == 16 and weights_hash(ref) != weights_hash(resolve_model("tiny-math"))
    from bench.moe import config_is_moe

    assert config_is_moe(ref.path) and not config_is_moe(str(TINY_MATH_DIR))
