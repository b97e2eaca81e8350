"""The settings of one build (`BuildConfig`, each a knob: bench/knobs.py) and their checks, in a
module of their own so that reading them (the CLI's options) imports neither torch nor an engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError
from bench.knobs import check, knob
from bench.model_sources import MODEL_HELP
from bench.problems import ColumnMap


class BuildError(BenchError, ValueError):
    """Bad build input or state; the message says what and how to fix it."""


@dataclass
class BuildConfig:
    """Settings of one build, each a knob (bench/knobs.py: `bench build`'s options are generated
    from them). Everything here except `out`, `resume`, `threads`, `device` and
    `keep_text` enters the settings hash that shards and resumes must share."""

    model: str = knob("tiny-math", help=MODEL_HELP, cli=False)
    source: str | None = knob(None, help="Problems: a .jsonl/.parquet/.csv file, a saved `datasets` directory, "
                              "'synthetic', 'arithmetic[:LEVELS]', 'math' or a hub id. Default: synthetic for "
                              "tiny-math, arithmetic for smollm2-135m and gemma3-270m, MATH otherwise.",
                              cli=False)
    template: str | None = knob(None, help="Prompt template: chat (the tokenizer's chat template) or plain "
                                "('Q: problem / instruction / A: '). Default: plain for the embedded models, "
                                "gemma3-270m and a directory whose bench-model.json says base; chat otherwise (bench "
                                "cannot tell a base checkpoint: pass plain for one). Recorded in the build; its runs "
                                "prompt the same way.")
    instruction: str | None = knob(None, help="The instruction after each problem. Default: the paper's 'Please "
                                   "reason step by step, and put your final answer within \\boxed{}.'; 'Put your "
                                   "final answer within \\boxed{}.' for smollm2-135m and gemma3-270m; none for the "
                                   "embedded models. Recorded in the build.")
    limit: int | None = knob(None, help="Use the first N problems (synthetic: draw N; default 300).",
                             unit="problems", ge=1)
    columns: ColumnMap = knob(help="Which columns hold the id, problem, answer, solution.", cli=False,
                              default_factory=ColumnMap)
    engine: str = knob("auto", help="Rollout engine: auto (vllm when importable), torch, vllm.", cli=False)
    dtype: str = knob("bf16", help="Rollout format: fp32, bf16, bf16+head32, fp16, fp8, int8, nvfp4, mxfp4.", cli=False)
    k: int = knob(40, help="Rollouts per problem.", unit="rollouts", ge=1)
    lo: float = knob(0.2, help="Keep problems with lo <= accuracy (inclusive); --band LO HI.", cli=False)
    hi: float = knob(0.8, help="Keep problems with accuracy <= hi (inclusive); --band LO HI.", cli=False)
    temperature: float = knob(1.0, help="Sampling temperature of the rollouts.", gt=0)
    top_p: float = knob(1.0, help="Nucleus sampling of the rollouts.", gt=0, le=1)
    max_tokens: int | None = knob(None, help="Max response length (default 64 for tiny-math, 128 for smollm2-135m "
                                  "and gemma3-270m, 8192 otherwise).",
                                  unit="tokens", ge=1)
    seed: int = knob(0, help="Seed of the rollouts (and of the synthetic problems).", ge=0)
    shard: str | None = knob(None, help="Build one shard i/n (0 <= i < n); join with `bench build merge`.",
                             cli=False)
    chunk: int = knob(32, help="Problems per persisted chunk (the unit of resume).", unit="problems", ge=1)
    out: Path | None = knob(None, help="Output directory (default $BENCH_HOME/builds/<id>).", cli=False)
    keep_text: bool = knob(False, help="Store each rollout's full text.")
    resume: bool = knob(False, help="Continue the unfinished build with the same settings.")
    force: bool = knob(False, help="Build again although a complete build has the same settings.")
    threads: int | None = knob(None, help="Torch threads for the torch engine.", unit="threads", ge=1)
    cascade_attention: bool = knob(False, help="The torch engine decodes with the shared-prefix attention (a "
                                   "prompt's keys read once per prompt, not once per sample; bench/engines/cascade.py"
                                   "): μ moves in its last bits, so a build with it has other settings.")
    device: str = knob("cpu", help="The torch engine's device (bench/device.py); vLLM picks its own.", cli=False)
    grade_timeout: float = knob(5.0, help="Hard per-answer timeout of the grader.", unit="seconds", gt=0)
    adaptive: bool = knob(False, help="Sample in rounds; stop a problem as soon as a Wilson interval for its "
                          "accuracy lies wholly inside or outside the band (at most k).")
    round_size: int = knob(2, help="Adaptive: rollouts per round.", unit="rollouts", ge=1)
    confidence: float = knob(0.85, help="Adaptive: two-sided confidence of the Wilson interval.", gt=0, lt=1)
    min_samples: int = knob(8, help="Adaptive: never decide a problem on fewer rollouts.", unit="rollouts", ge=1)

    def validate(self) -> None:
        check(self)             # every knob within its bounds (bench/knobs.py), one ConfigError naming it
        if self.k < 1:
            raise BuildError(f"k must be >= 1 (got {self.k})")
        if not (0.0 <= self.lo <= 1.0 and 0.0 <= self.hi <= 1.0):
            raise BuildError(f"band must lie in [0, 1] (got lo={self.lo}, hi={self.hi})")
        if self.lo > self.hi:
            raise BuildError(f"band lower bound {self.lo} is above the upper bound {self.hi}")
        if self.chunk < 1:
            raise BuildError("chunk must be >= 1")
        if self.adaptive and not (self.round_size >= 1 and 0 < self.confidence < 1):
            raise BuildError("adaptive builds need --round-size >= 1 and 0 < --confidence < 1")
        from bench.precision import canon

        self.dtype = canon(self.dtype)
        parse_shard(self.shard)


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    if shard is None:
        return None
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise BuildError(f"bad shard {shard!r}; write i/n with 0 <= i < n, e.g. 3/8") from None
    if not (n >= 1 and 0 <= i < n):
        raise BuildError(f"bad shard {shard!r}; need 0 <= i < n")
    return i, n
