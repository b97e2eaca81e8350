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


def write_llama_gguf(path: Path, model, quant: str = "F32") -> Path:
    """`model` (a LlamaForCausalLM over `byte_vocab()`) as a GGUF at `path`: F32, or Q8_0 linear
    weights (norms and the embedding stay F32, as llama.cpp keeps 1-D tensors)."""
    import gguf

    cfg = model.config
    tokens, merges = byte_vocab()
    arch = gguf.MODEL_ARCH.LLAMA
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name("bench-test-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None)
                               else cfg.rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
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
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight":          # tied: llama.cpp writes no output.weight
            continue
        data = t.detach().float().numpy()
        if hf_name.endswith("q_proj.weight"):
            data = _permute(data, cfg.num_attention_heads, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            data = _permute(data, cfg.num_attention_heads, cfg.num_key_value_heads)
        base = hf_name.removesuffix(".weight")
        name = names.get_name(base) or names.get_name(base.removeprefix("model."))
        assert name, hf_name
        if quant == "Q8_0" and data.ndim == 2 and "embd" not in name:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name + ".weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name + ".weight", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
