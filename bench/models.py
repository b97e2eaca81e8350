"""Model registry and prompt templates.

`--model` is an embedded name (`tiny-math`, or its mixture-of-experts twin `tiny-math-moe`), a
local directory holding a Hugging Face causal LM, or a hub id. Prompts use the model's chat
template when it has one, with the paper's instruction; the embedded models use a plain template.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError, did_you_mean

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TINY_MATH = "tiny-math"
TINY_MATH_DIR = Path(__file__).parent / "assets" / TINY_MATH
TINY_MATH_MOE = "tiny-math-moe"
TINY_MATH_MOE_DIR = Path(__file__).parent / "assets" / TINY_MATH_MOE
EMBEDDED = {TINY_MATH: TINY_MATH_DIR, TINY_MATH_MOE: TINY_MATH_MOE_DIR}
PLAIN_TEMPLATE = "Q: {problem}\nA: "


class ModelError(BenchError, ValueError):
    """A model that cannot be found or loaded."""


@dataclass(frozen=True)
class ModelRef:
    name: str          # as the user gave it, e.g. "tiny-math" or "deepseek-ai/..."
    path: str          # what transformers / vLLM load: a local directory or a hub id
    embedded: bool

    @property
    def template(self) -> str:
        return "plain" if self.embedded else "chat"


def resolve_model(name: str) -> ModelRef:
    """`tiny-math` / `tiny-math-moe` → the shipped weights; an existing directory → itself;
    `owner/name` → hub id."""
    if name in EMBEDDED:
        if not (EMBEDDED[name] / "model.safetensors").exists():
            raise ModelError(f"embedded model missing at {EMBEDDED[name]}; run `bench model train {name}`")
        return ModelRef(name, str(EMBEDDED[name]), True)
    p = Path(name).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelError(f"{p} is not a Hugging Face model directory (no config.json)")
        return ModelRef(name, str(p.resolve()), False)
    if "/" in name and not name.startswith((".", "/")) and name.count("/") == 1:
        return ModelRef(name, name, False)
    raise ModelError(f"unknown model {name!r}{did_you_mean(name, EMBEDDED)}: use 'tiny-math', 'tiny-math-moe', a "
                     "model directory, or a hub id owner/name")


def weights_hash(ref: ModelRef) -> str | None:
    """sha256 over the safetensors files of a local model (first 16 hex digits); None for hub ids."""
    p = Path(ref.path)
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    files = sorted(p.glob("*.safetensors")) or sorted(p.glob("*.bin"))
    for f in files:
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16] if files else None


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
    """The prompt text for one problem: the plain template for the embedded model, else the
    chat template with the paper's instruction (plain `problem + instruction` if the tokenizer
    has no chat template)."""
    if ref.template == "plain":
        return PLAIN_TEMPLATE.format(problem=problem)
    content = f"{problem}\n{INSTRUCTION}"
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                             tokenize=False, add_generation_prompt=True)
    return content + "\n"


def template_description(ref: ModelRef, tokenizer) -> str:
    """The rendered template with a placeholder problem, for the build manifest."""
    return render_prompt(ref, tokenizer, "{problem}")
