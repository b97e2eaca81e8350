"""The embedded models: a character-level tokenizer and two small causal LMs trained by
supervised learning on synthetic worked solutions.

`tiny-math`: a ~0.65M-parameter Llama. `bench model train tiny-math` runs `train()`; the
default config writes the weights shipped in bench/assets/tiny-math. Training length is the
knob that sets how many held-out problems fall in the [0.2, 0.8] band (measured here with the
torch engine in bf16: 1,000 steps leave most problems too hard, 15% in band; 2,500 steps give 59%).

`tiny-math-moe`: the same tokenizer, data and recipe on a Mixtral (transformers'
MixtralForCausalLM, which vLLM also runs): hidden 128, 3 layers, 8 experts of width 192 per
layer, top-2 routing (the two active experts together as wide as tiny-math's MLP, 384), ~1.9M
parameters, tied embeddings. `bench model train tiny-math-moe` (MOE_STEPS = 1,500 steps) writes
bench/assets/tiny-math-moe, stored in bf16 (as real MoE checkpoints ship; 3.8 MB instead of 7.6)
and loaded as fp32 masters. The learning rate is constant after warm-up, so the weights after
N steps of a longer run are those of `--steps N` (the shipped ones were saved at step 1,500 of a
2,500-step run, the CPU being too busy to finish it).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

from .models import PLAIN_TEMPLATE, TINY_MATH_DIR
from .synthetic import SFT_POOL, SFT_SEED, synthetic_examples

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = (list("0123456789+-*=.,:?!()/ \n{}\\$^_") + list("abcdefghijklmnopqrstuvwxyz")
         + list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))


def build_tokenizer():
    """Character-level PreTrainedTokenizerFast: every character one token, `<eos>` ends a
    response, `<pad>` pads, unknown characters map to `<unk>`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", bos_token=None, clean_up_tokenization_spaces=False)


@dataclass
class TinyConfig:
    """Architecture of the embedded model (Llama, tied embeddings). Not Qwen2: transformers 5
    forces Qwen2Tokenizer on any qwen2 model directory, discarding the character tokenizer."""

    hidden_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 128


@dataclass
class TrainConfig:
    """Supervised training of tiny-math on the synthetic `train` split."""

    steps: int = 2500          # the band knob (measured: 1,000 → 15% of held-out problems in band, 2,500 → 59%)
    batch_size: int = 64
    lr: float = 3e-3           # AdamW, constant after linear warm-up
    warmup: int = 50
    weight_decay: float = 0.01
    pool: int = SFT_POOL       # training problems drawn (with repeats); synthetic-hard excludes them
    seed: int = SFT_SEED
    threads: int = 1           # one thread is often faster on a busy 2-core machine
    out: Path = TINY_MATH_DIR
    arch: TinyConfig | TinyMoeConfig = None  # type: ignore[assignment]

    def __post_init__(self):
        self.arch = self.arch or TinyConfig()


MOE_STEPS = 1500     # tiny-math-moe's training steps: the shipped weights (docs/results.md, its band share)


@dataclass
class TinyMoeConfig:
    """Architecture of the embedded MoE model (Mixtral, tied embeddings): `num_experts` experts
    of width `intermediate_size` per layer, `top_k` of them per token (renormalised softmax
    weights, Mixtral's router); no load-balancing loss in training (router_aux_loss_coef 0:
    supervised on a tiny task the router still spreads tokens, measured in docs/results.md)."""

    hidden_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    intermediate_size: int = 192
    num_experts: int = 8
    top_k: int = 2
    max_position_embeddings: int = 128


def _shared_config(tokenizer, arch) -> dict:
    """The config fields tiny-math's Llama and tiny-math-moe's Mixtral share."""
    return dict(vocab_size=len(tokenizer), hidden_size=arch.hidden_size, num_hidden_layers=arch.num_hidden_layers,
                num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_attention_heads,
                intermediate_size=arch.intermediate_size, max_position_embeddings=arch.max_position_embeddings,
                tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)


def new_model(tokenizer, arch, seed: int = 0):
    """A fresh model of `arch`: TinyConfig → Llama (tiny-math), TinyMoeConfig → Mixtral (tiny-math-moe)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    if isinstance(arch, TinyMoeConfig):
        return MixtralForCausalLM(MixtralConfig(**_shared_config(tokenizer, arch), num_local_experts=arch.num_experts,
                                                num_experts_per_tok=arch.top_k, sliding_window=None,
                                                router_aux_loss_coef=0.0, output_router_logits=False))
    return LlamaForCausalLM(LlamaConfig(**_shared_config(tokenizer, arch)))


def _batch(tokenizer, examples: list[dict]):
    """Right-padded input ids and labels; loss only on the response (solution + eos)."""
    import torch

    ids, labels = [], []
    for ex in examples:
        p = tokenizer.encode(PLAIN_TEMPLATE.format(problem=ex["problem"]))
        r = tokenizer.encode(ex["solution"]) + [tokenizer.eos_token_id]
        ids.append(p + r)
        labels.append([-100] * len(p) + r)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    x = torch.tensor([s + [pad] * (width - len(s)) for s in ids])
    y = torch.tensor([s + [-100] * (width - len(s)) for s in labels])
    return x, y, (x != pad).long()


def train(cfg: TrainConfig, progress=None) -> dict:
    """Train and save model + tokenizer to `cfg.out`; returns a summary (final loss, wall time)."""
    import torch

    torch.set_num_threads(cfg.threads)
    tokenizer = build_tokenizer()
    model = new_model(tokenizer, cfg.arch, cfg.seed)
    pool = synthetic_examples("train", cfg.pool, seed=cfg.seed, distinct=False)
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup)))
    model.train()
    t0, loss_ema = time.time(), math.nan
    for step in range(cfg.steps):
        x, y, attn = _batch(tokenizer, rng.sample(pool, cfg.batch_size))
        loss = model(input_ids=x, attention_mask=attn, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.95 * loss_ema + 0.05 * loss.item()
        if progress:
            progress(step + 1, cfg.steps, loss_ema)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    if isinstance(cfg.arch, TinyMoeConfig):
        model = model.to(torch.bfloat16)          # shipped in bf16, loaded as fp32 masters
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"steps": cfg.steps, "loss": loss_ema, "wall_s": time.time() - t0,
            "parameters": sum(p.numel() for p in model.parameters()), "out": str(out)}
