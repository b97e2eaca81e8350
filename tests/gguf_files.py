"""GGUF files the tests write with gguf's own writer, the way llama.cpp's convert_hf_to_gguf.py
writes a Hugging Face checkpoint: a tiny random Llama (GQA, tied head, RoPE θ, q/k rows
permuted as llama.cpp does) with a byte-level BPE vocabulary and a chat template, in F32 or with
its linear weights in Q8_0 — so the real loading path (transformers' GGUF reader and
dequantizer, then bench's conversion) can be tested without a model package."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_vocab() -> tuple[list[str], list[str]]:
    """(tokens, merges): the 256 byte-level symbols, the merges of a few digit and word pairs and
    the special tokens last."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("1", "2"), ("Ġ", "1"), ("i", "s")]
    tokens = symbols + ["".join(m) for m in merges] + SPECIAL
    return tokens, [" ".join(m) for m in merges]


def tiny_llama(seed: int = 0, vocab: int | None = None):
    """A random LlamaForCausalLM: 2 layers, hidden 32, 4 query / 2 KV heads, tied head, θ 1e5."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens, _ = byte_vocab()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab or len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=1e5,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=256 + 6, eos_token_id=256 + 6)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():                     # norms away from 1, so a lost or doubled offset shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return model


def _permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's q/k row permutation (convert_hf_to_gguf.py LlamaModel.permute)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _writer(path: Path, arch, model, name: str):
    """A GGUFWriter for `model` with the hyper-parameters every llama.cpp architecture writes the
    same way, and its tensor-name map."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    return w, gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)


def _write_tensors(w, names, model, convert) -> None:
    """Every tensor of `model` but the tied head, under its GGUF name, as `convert(hf_name,
    gguf_name, fp32 array)` gives it ((array, raw dtype or None)); then the file."""
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight":          # tied: llama.cpp writes no output.weight
            continue
        base = hf_name.removesuffix(".weight")
        name = names.get_name(base) or names.get_name(base.removeprefix("model."))
        assert name, hf_name
        data, raw = convert(hf_name, name, t.detach().float().numpy())
        if raw is None:
            w.add_tensor(name + ".weight", data)
        else:
            w.add_tensor(name + ".weight", data, raw_shape=data.shape, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_llama_gguf(path: Path, model, quant: str = "F32") -> Path:
    """`model` (a LlamaForCausalLM over `byte_vocab()`) as a GGUF at `path`: F32, or Q8_0 linear
    weights (norms and the embedding stay F32, as llama.cpp keeps 1-D tensors)."""
    import gguf

    cfg = model.config
    tokens, merges = byte_vocab()
    w, names = _writer(path, gguf.MODEL_ARCH.LLAMA, model, "bench-test-llama")
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None)
                               else cfg.rope_theta))
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    ftype = {"F32": gguf.LlamaFileType.ALL_F32, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[quant]
    w.add_file_type(ftype)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(CHAT_TEMPLATE)

    def convert(hf_name, name, data):
        if hf_name.endswith("q_proj.weight"):
            data = _permute(data, cfg.num_attention_heads, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            data = _permute(data, cfg.num_attention_heads, cfg.num_key_value_heads)
        if quant == "Q8_0" and data.ndim == 2 and "embd" not in name:
            return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
        return data, None

    _write_tensors(w, names, model, convert)
    return path

def sentencepiece_vocab() -> tuple[list[str], list[int]]:
    """(tokens, token types) of a small Gemma-style sentencepiece vocabulary: pad, eos, bos, unk,
    the 256 byte-fallback pieces, "▁", the letters and digits and a few merged pieces."""
    import gguf

    special = ["<pad>", "<eos>", "<bos>", "<unk>"]
    pieces = ["\u2581"] + list("abcdefghijklmnopqrstuvwxyz0123456789?+=.") + ["\u2581t", "he", "\u2581the", "\u2581W",
                                                                             "at", "\u2581is"]
    tokens = special + [f"<0x{i:02X}>" for i in range(256)] + pieces
    T = gguf.TokenType
    types = [T.CONTROL, T.CONTROL, T.CONTROL, T.UNKNOWN] + [T.BYTE] * 256 + [T.NORMAL] * len(pieces)
    return tokens, [int(t) for t in types]


def tiny_gemma3(seed: int = 0):
    """A random Gemma3ForCausalLM: 6 layers (five sliding-window ones of window 4, then a global
    one), hidden 32, 2 query / 1 KV heads of 16, q/k norms, tied head, the default RoPE θ (1e4
    local, 1e6 global) and query_pre_attn_scalar — what a GGUF does not carry."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tokens, _ = sentencepiece_vocab()
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                           max_position_embeddings=128, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1,
                           bos_token_id=2, tie_word_embeddings=True)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(-0.5, 0.5)          # Gemma's RMSNorm scales by (1 + w): away from 0, so the offset shows
    return model


def write_gemma3_gguf(path: Path, model) -> Path:
    """`model` (tiny_gemma3) as llama.cpp's converter writes Gemma 3: norms shifted by +1, no
    output.weight (tied), a sentencepiece ("llama") vocabulary, F32."""
    import gguf

    cfg = model.config
    tokens, types = sentencepiece_vocab()
    w, names = _writer(path, gguf.MODEL_ARCH.GEMMA3, model, "bench-test-gemma3")
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(cfg.sliding_window)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_pad_token_id(0)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    # llama.cpp's Gemma norm_shift: its RMSNorm weights are stored as 1 + w
    _write_tensors(w, names, model, lambda hf_name, name, data: (data + 1.0 if hf_name.removesuffix(".weight")
                                                                  .endswith("norm") else data, None))
    return path
