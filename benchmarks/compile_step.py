"""`torch.compile` (inductor, `dynamic=True`: a micro-batch's rows and width change every pass)
of the model's body on the training forward + backward of the demo's step: tiny-math, pg-seq-is,
64 prompts × 8, the trainer's parts (grouped by length), one torch thread, against the same
model eager. Measured, not adopted: it is an arithmetic change (inductor fuses and reorders), so
a product path goes through the equivalence protocol (docs/development.md).

    python benchmarks/compile_step.py [--dtype fp32|fp16] [--repeats 3] [--threads 1] [--emulate-precision-casts]

Prints the compile (the first pass's time), the fastest of `--repeats` each way after it, their
ratio, and how far the compiled model's log π and gradient are from eager's on the same batch.
The compile is cold (inductor's cache in a new folder) unless TORCHINDUCTOR_CACHE_DIR is set."""

from __future__ import annotations

import argparse
import os
import tempfile
import time

# a cold compile, as a run's first process has it: inductor's on-disk cache in a new folder
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-"))

import torch  # noqa: E402

from bench.provenance import cpu_summary  # noqa: E402


def main() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from microbatch_cost import first_step
    from shared_prompt_train import grads, packed_pass

    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp32", help="the training format: fp32, or fp16 as the demo trains")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--emulate-precision-casts", action="store_true",
                    help="inductor's emulate_precision_casts: round where eager rounds (by default a fused kernel "
                         "may keep fp32 between the 16-bit casts bench's formats write)")
    a = ap.parse_args()
    if a.emulate_precision_casts:
        import torch._inductor.config as inductor_config

        inductor_config.emulate_precision_casts = True
    t, _, batch = first_step(a.dtype, a.threads)
    model = t.learner.compute
    parts = t.learner.parts(list(range(len(batch.lengths))), batch)

    def one_pass() -> tuple[float, torch.Tensor, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        lp = packed_pass(model, batch, parts)
        return time.perf_counter() - t0, lp, grads(model)

    body = model.base_model
    eager_forward = body.forward
    compiled_forward = torch.compile(eager_forward, dynamic=True)
    from torch._dynamo.utils import counters

    body.forward = compiled_forward
    first = one_pass()                                     # the compile, and one pass
    eager, compiled = [], []
    for _ in range(a.repeats):                             # in turn: the host's drift falls on both sides
        body.forward = eager_forward
        eager.append(one_pass())
        body.forward = compiled_forward
        compiled.append(one_pass())
    e, c = min(x[0] for x in eager), min(x[0] for x in compiled)
    dlp = (compiled[-1][1] - eager[-1][1]).abs().max().item()
    dg = ((compiled[-1][2] - eager[-1][2]).norm() / eager[-1][2].norm()).item()
    even = f"break-even after {(first[0] - c) / (e - c):.0f} passes" if c < e else "never breaks even"
    casts = ", emulate_precision_casts" if a.emulate_precision_casts else ""
    print(f"training forward + backward of the demo's step, tiny-math pg-seq-is {a.dtype}{casts}, 64 × 8, "
          f"{len(parts)} parts, {a.threads} thread(s), torch {torch.__version__}; {cpu_summary()}")
    print(f"  eager {e:.3f} s; compiled (inductor, dynamic) {c:.3f} s: ratio {c / e:.2f}; compile + first pass "
          f"{first[0]:.1f} s ({even}); graphs compiled {counters['stats']['unique_graphs']} (one step's shapes: "
          f"later steps' widths may recompile)")
    print(f"  compiled against eager: max |Δ log π| {dlp:.2e}, |Δ gradient| / |gradient| {dg:.2e}")
    t.close()


if __name__ == "__main__":
    main()
