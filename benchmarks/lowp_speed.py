"""16-bit against fp32 on this CPU: one tiny-math RL step's two halves, per format.

Rollouts: the built-in engine samples 64 prompts × 8 (≤ 64 tokens, T = 1) after a warm-up
batch of the same shapes. Training: one forward + backward of the training engine's compute
copy over those samples (response log-probs, a REINFORCE-style loss). Every format is timed
once a repeat, in turn; the script prints seconds (the median of `--repeats` passes) and the
ratio to the first format (fp32 by default) per format, the kernels each engine used, the
CPU's 16-bit flags, and the training–inference mismatch of the samples (k3 per token) so a
speed-up that made the two engines compute alike would show. Goal (issue 12): every 16-bit
ratio ≤ 1.3; sub-16-bit rollouts (fp8, int8, nvfp4) ≤ 1.3× bf16's rollout time (issue 22).

A rollout-only format (int8, nvfp4: no such training) is timed on the rollout side; its
training half and k3 are those of the pair `rollout=FORMAT,train=--train-for` (fp16, the
demo's pair), marked so in the table.

    python benchmarks/lowp_speed.py [--formats fp32,bf16,fp16,fp8,nvfp4] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def train_pass(compute, batch) -> torch.Tensor:
    """One forward + backward of the compute copy over `batch` (response log-probs, a
    REINFORCE-style loss); the detached log-probs."""
    from runners.logprobs import response_logprobs

    lp = response_logprobs(compute, *batch.tensors)
    (-(lp * batch.mask).sum() / batch.mask.sum()).backward()
    compute.zero_grad(set_to_none=True)
    return lp.detach()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="fp32,bf16,fp16,bf16:torch,fp16:torch",
                    help="formats; FORMAT:torch = the rollout engine on torch's own 16-bit kernels (the baseline)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed rollouts and training passes per format (the same samples each time): "
                         "the median is printed")
    ap.add_argument("--train-for", default="fp16",
                    help="the training format paired with a rollout-only format (int8, nvfp4)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from bench import model_formats, formats, kernels
    from bench.engines import Sampling
    from bench.engines.torch_engine import TorchEngine
    from bench.mismatch import mismatch_metrics
    from bench.models import load_model, load_tokenizer, render_prompt, resolve_model
    from bench.problems import SourceSpec, load_problems
    from bench.provenance import cpu_summary
    from runners.train_engine import Batch

    ref = resolve_model("tiny-math")
    tok = load_tokenizer(ref)
    probs = load_problems(SourceSpec("synthetic", limit=args.prompts))
    prompts = [render_prompt(ref, tok, p.problem) for p in probs]
    pids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    print(f"{cpu_summary()}; torch {torch.__version__}; {args.threads} thread(s)")
    specs = args.formats.split(",")
    sp_warm, sp = Sampling(1.0, 1.0, 64, seed=1), Sampling(1.0, 1.0, 64, seed=2)
    cells = {}
    for spec in specs:                                  # every engine and compute copy, warmed up
        fmt = spec.removesuffix(":torch")
        eng = TorchEngine(ref.path, fmt, vllm_kernels=not spec.endswith(":torch"))
        eng.generate(prompts, 8, sp_warm)                                               # same shapes
        flat = [s for r in eng.generate(prompts, 8, sp) for s in r]
        batch = Batch.pack([p for p in pids for _ in range(8)], [s.token_ids for s in flat], tok.pad_token_id)
        mu = torch.zeros(batch.mask.shape)
        for i, s in enumerate(flat):
            mu[i, :len(s.logprobs)] = torch.tensor(s.logprobs)
        train_fmt = fmt if fmt in formats.TRAIN_FORMATS else args.train_for
        compute = model_formats.prepare_compute_model(load_model(ref, torch.float32), train_fmt)
        compute.train()
        cells[spec] = dict(eng=eng, batch=batch, mu=mu, train_fmt=train_fmt, compute=compute, roll=[], train=[])
        train_pass(compute, batch)                                   # warm-up

    # round robin: each repeat times every format once, so a machine that speeds up or slows
    # down during the run moves every format's times alike
    for _ in range(args.repeats):
        for c in cells.values():
            t = time.perf_counter()
            c["eng"].generate(prompts, 8, sp)
            c["roll"].append(time.perf_counter() - t)
            t = time.perf_counter()
            c["lp"] = train_pass(c["compute"], c["batch"])
            c["train"].append(time.perf_counter() - t)

    rows, base = [], {}
    for spec, c in cells.items():
        fmt, train_fmt, batch = spec.removesuffix(":torch"), c["train_fmt"], c["batch"]
        t_roll, t_train = statistics.median(c["roll"]), statistics.median(c["train"])
        k3 = mismatch_metrics(c["mu"], c["lp"] * batch.mask, batch.mask)["kl_k3"]
        base.setdefault("roll", t_roll)
        base.setdefault("train", t_train)
        train_mm = "upcast" if train_fmt != "fp32" and kernels.should_upcast(train_fmt) else "native"
        if train_fmt != fmt:
            train_mm += f" ({train_fmt})"
        rows.append((spec, t_roll, t_roll / base["roll"], t_train, t_train / base["train"], c["eng"].kernels,
                     train_mm, k3))
    bf16 = next((tr for f, tr, *_ in rows if f == "bf16"), None)
    first = "×" + rows[0][0].removesuffix(":torch")
    print(f"median of {args.repeats} timed passes each, the formats in turn; × the first format ({rows[0][0]})"
          + (" and × bf16's rollout" if bf16 else ""))
    print(f"{'format':<11} {'rollout s':>9} {first:>6} {'×bf16':>6} {'train s':>8} {first:>6}  rollout kernels"
          f"                          train GEMM     k3/token")
    for fmt, tr, rr, tt, rt, kern, mm, k3 in rows:
        xb = f"{tr / bf16:6.2f}" if bf16 else f"{'—':>6}"
        print(f"{fmt:<11} {tr:9.2f} {rr:6.2f} {xb} {tt:8.2f} {rt:6.2f}  {str(kern):<40} {mm:<13}  {k3:.2e}")


if __name__ == "__main__":
    main()
