"""Model registry and prompt templates.

`--model` is an embedded name (`tiny-math`, or its mixture-of-experts twin `tiny-math-moe`), a
named real model shipped by a registry package (`smollm2-135m`, `gemma3-270m`:
bench/model_sources.py) or one of them after bench's answer-format warm-up (`smollm2-135m-warm`:
bench/warmup.py, made once on first use), a `.gguf` file (dequantized once into a cached Hugging Face
directory), a local directory holding a Hugging Face causal LM, or a hub id.

Prompts (`render_prompt`): the **chat** template — the tokenizer's chat template around
"problem\ninstruction", the instruction defaulting to the paper's — or the **plain** one,
"Q: problem\nA: " with the instruction, if any, on its own line before "A: ". The embedded
models take the plain template without an instruction (what they were trained on); a base model
(no chat template, e.g. gemma3-270m) the plain one with the instruction. A build records its
template and instruction, and its runs prompt as it did (`with_prompt`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from bench.errors import BenchError, did_you_mean
from bench.model_sources import (GGUF_MARKER, MODEL_FILE, NAMED, WARMED, ModelSourceError, converted_dir, file_sha256,
                                 gguf_provenance, model_defaults, models_home, named_gguf, write_model_dir)

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TINY_MATH = "tiny-math"
TINY_MATH_DIR = Path(__file__).parent / "assets" / TINY_MATH
TINY_MATH_MOE = "tiny-math-moe"
TINY_MATH_MOE_DIR = Path(__file__).parent / "assets" / TINY_MATH_MOE
EMBEDDED = {TINY_MATH: TINY_MATH_DIR, TINY_MATH_MOE: TINY_MATH_MOE_DIR}
PLAIN_TEMPLATE = "Q: {problem}\nA: "
TEMPLATES = ("chat", "plain")


class ModelError(BenchError, ValueError):
    """A model that cannot be found or loaded."""


@dataclass(frozen=True)
class ModelRef:
    name: str          # as the user gave it, e.g. "tiny-math" or "deepseek-ai/..."
    path: str          # what transformers / vLLM load: a local directory or a hub id
    embedded: bool
    base: bool = False                 # a base model without a chat template: the plain template by default
    prompt_template: str | None = None     # "chat" or "plain"; None: the model's default
    prompt_instruction: str | None = None  # None: the model's default (the paper's; none for the embedded)

    @property
    def template(self) -> str:
        return self.prompt_template or ("plain" if self.embedded or self.base else "chat")

    @property
    def instruction(self) -> str:
        if self.prompt_instruction is not None:
            return self.prompt_instruction
        return "" if self.embedded else INSTRUCTION


def with_prompt(ref: ModelRef, template: str | None = None, instruction: str | None = None) -> ModelRef:
    """`ref` prompting with `template` ("chat" or "plain") and `instruction` (None: unchanged)."""
    if template is not None and template not in TEMPLATES:
        raise ModelError(f"--template {template!r}: use one of {', '.join(TEMPLATES)}")
    return replace(ref, prompt_template=template if template is not None else ref.prompt_template,
                   prompt_instruction=instruction if instruction is not None else ref.prompt_instruction)


def _carried_defaults(ref: ModelRef) -> dict | None:
    """The source and response length a real model carries: a named model's (bench/model_sources.py)
    or a warmed directory's bench-model.json; None for any other."""
    if ref.name in NAMED:
        return {"source": NAMED[ref.name].source, "max_tokens": NAMED[ref.name].max_tokens}
    carried = model_defaults(ref.path) if Path(ref.path).is_dir() else None
    return {"source": carried["source"], "max_tokens": carried["max_tokens"]} if carried else None


def build_defaults(ref: ModelRef) -> dict:
    """What a build of `ref` defaults to where the user gave nothing: its problem source and
    response length (a named or warmed real model carries its own: `_carried_defaults`)."""
    if ref.embedded:
        return {"source": "synthetic", "max_tokens": 64}
    return _carried_defaults(ref) or {"source": "math", "max_tokens": 8192}


def measure_defaults(ref: ModelRef, otherwise_tokens: int | None = None) -> dict:
    """What `bench check` and `bench mismatch` measure on where the user gave nothing: the embedded
    models' held-out hard problems at 64 tokens; a named or warmed real model's build defaults
    (`arithmetic` at 128 tokens); any other model synthetic-hard at `otherwise_tokens` (default:
    its build length)."""
    if ref.embedded:
        return {"source": "synthetic-hard", "max_tokens": 64}
    return _carried_defaults(ref) or {"source": "synthetic-hard", "max_tokens": otherwise_tokens or 8192}


def fill_measure_defaults(cfg, ref: ModelRef, otherwise_tokens: int | None = None):
    """`cfg` (a check's or a mismatch's config) with its source and length, where None, set to
    `measure_defaults`: what it measures on, recorded as given or as defaulted."""
    own = measure_defaults(ref, otherwise_tokens)
    cfg.source, cfg.max_tokens = cfg.source or own["source"], cfg.max_tokens or own["max_tokens"]
    return cfg


def prompt_settings(ref: ModelRef) -> dict:
    """What a build records of how it prompted: {"template", "instruction"}."""
    return {"template": ref.template, "instruction": ref.instruction}


def resolve_model(name: str) -> ModelRef:
    """`tiny-math` / `tiny-math-moe` → the shipped weights; `smollm2-135m` / `gemma3-270m` → their
    package's GGUF, converted once (bench/model_sources.py); a `.gguf` file → its converted
    directory; an existing directory → itself; `owner/name` → hub id."""
    if name in EMBEDDED:
        if not (EMBEDDED[name] / "model.safetensors").exists():
            raise ModelError(f"embedded model missing at {EMBEDDED[name]}; run `bench model train {name}`")
        return ModelRef(name, str(EMBEDDED[name]), True)
    if name in NAMED:
        return ModelRef(name, str(_named_dir(name)), False, base=NAMED[name].base,
                        prompt_instruction=NAMED[name].instruction)
    if name in WARMED:
        return replace(resolve_model(str(_warmed_dir(name))), name=name)
    p = Path(name).expanduser()
    if p.suffix.lower() == ".gguf":
        if not p.is_file():
            raise ModelError(f"no GGUF file at {p}")
        try:
            return ModelRef(name, str(converted_dir(p)), False)
        except ModelSourceError as e:
            raise ModelError(str(e)) from None
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelError(f"{p} is not a Hugging Face model directory (no config.json)")
        carried = model_defaults(p) or {}        # a warmed model's (bench/warmup.py): its prompt
        return ModelRef(name, str(p.resolve()), False, base=bool(carried.get("base")),
                        prompt_template=carried.get("template"), prompt_instruction=carried.get("instruction"))
    if "/" in name and not name.startswith((".", "/")) and name.count("/") == 1:
        return ModelRef(name, name, False)
    raise ModelError(f"unknown model {name!r}{did_you_mean(name, [*EMBEDDED, *NAMED, *WARMED])}: use 'tiny-math', "
                     f"'tiny-math-moe', {', '.join(repr(n) for n in [*NAMED, *WARMED])}, a .gguf file, a model "
                     "directory, or a hub id owner/name")


def _named_dir(name: str) -> Path:
    """The converted directory of named model `name`: cached by name and package version (found
    without hashing the GGUF again), converted from the package's file on first use."""
    m = NAMED[name]
    cached = models_home() / f"{name}-{m.version}"
    if (cached / GGUF_MARKER).is_file():
        return cached
    try:
        src = converted_dir(named_gguf(name))
    except ModelSourceError as e:
        raise ModelError(str(e)) from None
    if not cached.exists():
        try:
            cached.symlink_to(src, target_is_directory=True)
        except FileExistsError:
            pass
    return cached


def _warmed_dir(name: str) -> Path:
    """The directory of warmed model `name` (model_sources.WARMED): its base warmed with the
    warm-up's defaults, under the name `bench model warmup BASE` gives it; made on first use."""
    from bench.warmup import WarmupConfig, warmed_name

    cfg = WarmupConfig()
    out = models_home() / warmed_name(WARMED[name], cfg)
    if not (out / MODEL_FILE).is_file():
        print(f"warming {WARMED[name]} up into {out} (once: {cfg.steps} steps, bench/warmup.py)", file=sys.stderr)
        warm_model(WARMED[name], cfg, out, progress=_warmup_line)
    return out


def _warmup_line(step: int, steps: int, loss: float) -> None:
    """A warm-up made on first use shows its progress on stderr: a line every 5 steps and the last."""
    if step % 5 == 0 or step == steps:
        print(f"  warm-up step {step}/{steps}: loss {loss:.4f}", file=sys.stderr, flush=True)


def warm_model(name: str, cfg, out: Path, progress=None) -> dict:
    """Warm model `name` up with WarmupConfig `cfg` (bench/warmup.py) and save it to `out` with
    `bench-model.json` (where it came from, the settings and losses, the defaults its builds take),
    written into a temporary directory renamed into place: a killed warm-up leaves nothing a later
    one would take for complete. Returns a summary."""
    import torch

    from bench.warmup import checked, train

    checked(cfg)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelError(f"{out} already holds files (a model, or what a killed warm-up left): remove it or warm up "
                         "into another directory")
    ref = resolve_model(name)
    tok = load_tokenizer(ref)
    model = load_model(ref, torch.float32)
    record = {"warmed_from": {"model": ref.name, "weights_hash": weights_hash(ref),
                              "model_source": gguf_provenance(ref.path)},
              "warmup": train(model, tok, lambda problem: render_prompt(ref, tok, problem), cfg, progress),
              "defaults": {**prompt_settings(ref), "base": ref.base, "source": "arithmetic",
                           "max_tokens": cfg.max_tokens}}
    write_model_dir(out, model, tok, MODEL_FILE, record)
    losses = record["warmup"]["losses"]
    return {"out": str(out), "steps": cfg.steps, "first_loss": losses[0], "last_loss": losses[-1],
            "wall_s": record["warmup"]["wall_s"]}


def weights_hash(ref: ModelRef) -> str | None:
    """sha256 over the safetensors files of a local model (first 16 hex digits); None for hub ids."""
    p = Path(ref.path)
    if not p.is_dir():
        return None
    files = sorted(p.glob("*.safetensors")) or sorted(p.glob("*.bin"))
    return file_sha256(*files)[:16] if files else None


def load_tokenizer(ref: ModelRef):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(ref.path)
    except Exception as e:
        raise ModelError(f"cannot load tokenizer of {ref.name!r}: {e}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(ref: ModelRef, dtype=None):
    """The causal LM in `dtype` (default fp32), eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype or torch.float32)
    except Exception as e:
        raise ModelError(f"cannot load model {ref.name!r}: {e}") from None
    return model.eval()


def render_prompt(ref: ModelRef, tokenizer, problem: str) -> str:
    """The prompt text for one problem (module docstring): plain, "Q: problem\nA: " (with the
    instruction, where there is one, on its own line before "A: "); chat, the tokenizer's chat
    template around "problem\ninstruction" (plain `problem\ninstruction\n` if the tokenizer has
    no chat template)."""
    content = f"{problem}\n{ref.instruction}" if ref.instruction else problem
    if ref.template == "plain":
        return PLAIN_TEMPLATE.format(problem=content)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                             tokenize=False, add_generation_prompt=True)
    return content + "\n"


def template_description(ref: ModelRef, tokenizer) -> str:
    """The rendered template with a placeholder problem, for the build manifest."""
    return render_prompt(ref, tokenizer, "{problem}")
