"""The paper's published results as reference rows: Qi et al. 2025's runs per algorithm and
precision pair (DeepSeek-R1-Distill-Qwen-1.5B on its 1,460-problem perfectible split, 8×A100),
read from the packaged `paper_reference.json` (bench/data, via `bench.problems.paper_reference`:
data shipped with the package, not a stage). Shown beside our cells, never ranked with them:
another model, another split, thousands of steps.

A reference row: `algo` (our name; None for the paper's precision ablation, which names no
algorithm), `precision` (our naming: `fp16`, or `rollout→train` for a mixed pair), `source`
("paper (verl)", "paper (oat)" or "paper" when the text names no framework), `peak_train_acc`
(peak training accuracy on the split, None when not given), `aime24` (as published, text:
"0.34", "0.28-0.30 (peak)"), `outcome`, `note`.
"""

from __future__ import annotations

from collections.abc import Iterable

from bench.precision import pair_name

ALL_FIVE = ("grpo", "grpo-token-tis", "grpo-seq-mis", "gspo", "pg-seq-is")
COLUMNS = ["algo", "precision", "source", "peak_train_acc", "aime24", "outcome", "note"]


def _aime(run: dict) -> str | None:
    if run.get("aime24") is not None:
        return str(run["aime24"])
    if run.get("aime24_peak") is not None:
        return f"{run['aime24_peak']} (peak)"
    return None


def reference_rows(ref: dict | None = None) -> list[dict]:
    """One row per published run in `ref["runs"]` (default: the packaged file); the paper's
    "all five" fp16 row stands for each of the five algorithms it names."""
    if ref is None:
        from bench.problems import paper_reference

        ref = paper_reference()
    rows = []
    for run in ref.get("runs", []):
        name = str(run.get("algo", ""))
        note = run.get("note")
        if name.startswith("all five"):
            algos: list[str | None] = list(ALL_FIVE)
            note = "; ".join(x for x in (note, "published as one row for all five algorithms") if x)
        elif name == "precision ablation":
            algos = [None]
        else:
            algos = [name]
        framework = run.get("framework")
        for algo in algos:
            rows.append({"algo": algo, "precision": pair_name(run["rollout"], run["train"]),
                         "source": f"paper ({framework})" if framework else "paper",
                         "peak_train_acc": run.get("peak_train_acc"), "aime24": _aime(run),
                         "outcome": run.get("outcome"), "note": note})
    return rows


def matching_rows(cells: Iterable[tuple[str, str]], rows: list[dict] | None = None) -> tuple[list[dict], int]:
    """(the reference rows for the given (algo, precision) cells, how many other rows there
    are). A row of the precision ablation (no algorithm) matches any cell at its precision."""
    rows = reference_rows() if rows is None else rows
    cells = set(cells)
    precisions = {p for _, p in cells}
    hit = [r for r in rows if (r["algo"], r["precision"]) in cells
           or (r["algo"] is None and r["precision"] in precisions)]
    return hit, len(rows) - len(hit)


def paper_offline_mismatch(ref: dict | None = None) -> dict | None:
    """The paper's offline bf16 vs fp16 mismatch (KL[μ‖π] in bits and the ratio as published)."""
    if ref is None:
        from bench.problems import paper_reference

        ref = paper_reference()
    m = ref.get("offline_mismatch")
    if not m:
        return None
    bf16, fp16 = (m.get("bf16") or {}).get("kl_mu_pi_bits"), (m.get("fp16") or {}).get("kl_mu_pi_bits")
    return {"setup": m.get("setup"), "kl_bits_bf16": bf16, "kl_bits_fp16": fp16,
            "ratio_bf16_over_fp16": bf16 / fp16 if bf16 and fp16 else None,
            "ratio_as_published": m.get("ratio_bf16_over_fp16")}
