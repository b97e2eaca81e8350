"""Training-step time: bench's native trainer vs TRL's GRPOTrainer on the same model, batch
(16 prompts × 8 completions), sampling (T=1, top-p 1, the model's build length of new tokens: 64
for tiny-math, 128 for smollm2-135m), fp32, CPU, the same grader as reward. `--model` takes what
`bench build --model` takes: a real model trains on its build's problems, prompted with its
template, with the small preset's micro-batches (2,048 padded tokens) and learning rate. Peak
memory (max RSS) is printed beside each. Needs `pip install trl`.

    python benchmarks/train_step.py [--model tiny-math] [--steps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import resource
import tempfile
import time

import torch

from bench.grading import Grader
from bench.models import ModelRef, build_defaults, load_tokenizer, render_prompt, resolve_model
from bench.precision import Precision
from bench.problems import Problem, SourceSpec, load_problems
from bench.provenance import cpu_summary
from bench.synthetic import synthetic_examples
from bench.store import open_store
from runners.presets import get_preset
from runners.plan import RunPlan
from runners.trainer import NativeTrainer

B, G = 16, 8


PHASES = ("time_rollout", "time_scoring", "time_update")


def peak_gib() -> float:
    """This process's peak resident memory so far (GiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def ours(ref: ModelRef, problems: list[Problem], steps: int, threads: int, max_new: int) -> tuple[float, dict]:
    """Seconds a step, and its phases' (the trainer's own step metrics: rollout; grading and the
    forward; backward, AdamW and the weight sync)."""
    cfg = get_preset("tiny" if ref.embedded else "small", max_tokens=max_new)
    cfg.prompts_per_step, cfg.samples_per_prompt, cfg.threads, cfg.benchmarks = B, G, threads, []
    store = open_store(f"sqlite:///{tempfile.mkdtemp()}/b.db")
    plan = RunPlan("grpo", Precision("fp32", "fp32"), cfg, "bench", "bench", ref, "torch", "cpu")
    t = NativeTrainer(store, "bench", plan, problems, None)
    t.train_step()                                     # warm-up
    phases = dict.fromkeys(PHASES, 0.0)
    t0 = time.perf_counter()
    for _ in range(steps):
        m = t.train_step()
        t.step += 1
        for k in PHASES:
            phases[k] += m[k] / steps
    dt = (time.perf_counter() - t0) / steps
    t.close()
    return dt, phases


def trl(ref: ModelRef, problems: list[Problem], steps: int, threads: int, max_new: int,
        lr: float) -> tuple[float, float]:
    """Seconds a step, and of it in the model's generate()."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    tok = load_tokenizer(ref)
    model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32)
    ds = Dataset.from_list([{"prompt": render_prompt(ref, tok, p.problem), "answer": p.answer} for p in problems])
    grader = Grader()

    def reward(completions, answer, **_):
        return [float(v.correct) for v in grader.grade(completions, answer)]

    times: list[float] = []
    generating: list[float] = []
    own_generate = model.generate

    def timed_generate(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return own_generate(*args, **kwargs)
        finally:
            generating[-1] += time.perf_counter() - t0
    model.generate = timed_generate

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            generating.append(0.0)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    # a real model's step in micro-batches of one prompt's G completions, as bench's run in micro-batches
    # of 2,048 padded tokens: TRL's whole 128-row batch of 49,152-token logits was killed for memory at
    # 19 GB RSS on a 24 GiB machine (2026-12-05)
    micro = B * G if ref.embedded else G
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=micro,
                      gradient_accumulation_steps=B * G // micro, num_generations=G,
                      max_completion_length=max_new, learning_rate=lr, bf16=False, fp16=False,
                      gradient_checkpointing=False, use_cpu=True, max_steps=steps + 1, logging_steps=1,
                      report_to=[], temperature=1.0, top_p=1.0, top_k=0, beta=0.0, loss_type="dr_grpo",
                      save_strategy="no", dataloader_num_workers=0, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[Timer()])
    trainer.train()
    grader.close()
    n = len(times) - 1                                 # first step is warm-up
    return sum(times[1:]) / n, sum(generating[1:len(times)]) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-math", help="what `bench build --model` takes")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    ref = resolve_model(a.model)
    defaults = build_defaults(ref)
    if ref.embedded:                                   # the numbers of benchmarks/README.md: the same problems
        problems = [Problem(r["id"], r["problem"], r["answer"]) for r in synthetic_examples("test", 200)]
    else:
        problems = load_problems(SourceSpec(defaults["source"], limit=200))
    max_new = defaults["max_tokens"]
    t_ours, phases = ours(ref, problems, a.steps, a.threads, max_new)
    print(f"GRPO step, {ref.name}, {B} prompts × {G} completions, ≤{max_new} tokens, fp32, "
          f"{a.threads} thread(s), mean of {a.steps}; {cpu_summary()}")
    print(f"  bench native trainer  {t_ours:6.2f} s/step   rollout {phases['time_rollout']:.2f} s, "
          f"grading (+ π_old's forward where the update does not make it) {phases['time_scoring']:.2f} s, "
          f"the update (forward, backward, AdamW) + weight sync {phases['time_update']:.2f} s; "
          f"peak RSS {peak_gib():.1f} GiB", flush=True)         # before TRL's side, which may be killed for memory
    t_trl, t_gen = trl(ref, problems, a.steps, a.threads, max_new,
                       lr=5e-4 if ref.embedded else get_preset("small").lr)
    print(f"  TRL GRPOTrainer       {t_trl:6.2f} s/step   generate() {t_gen:.2f} s, the rest {t_trl - t_gen:.2f} s; "
          f"peak RSS of the process after it {peak_gib():.1f} GiB")
    print(f"  ratio ours/TRL: {t_ours / t_trl:.2f} (goal <= 0.6, issue 37); outside the rollout: "
          f"{(t_ours - phases['time_rollout']) / (t_trl - t_gen):.2f}")


if __name__ == "__main__":
    main()
