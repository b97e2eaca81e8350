#!/usr/bin/env bash
# Wall time of the README's main job (`./bench.sh demo`) on a fresh BENCH_HOME, against the
# 300 s goal (issue 22) for build + offline mismatch + pg-seq-is with mxfp4 and fp16 rollouts (two jobs) +
# the report, with the CPU (model, family, cores) and its 16-bit flags beside it (they decide which kernels the formats run).
#   bash benchmarks/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# a fresh store; the environment's set-up is included only when .venv does not exist yet
export BENCH_HOME=$(mktemp -d)
start=$(date +%s)
./bench.sh demo
end=$(date +%s)
wall=$((end - start))
cpu=$("${BENCH_VENV:-.venv}/bin/python" -c "from bench.provenance import cpu_summary; print(cpu_summary())" 2>/dev/null || echo "-")
python3 - "$wall" "$cpu" <<'PY'
import sys
w = int(sys.argv[1])
print(f"demo wall time {w} s ({w / 60:.1f} min); goal 300 s → ratio {w / 300:.2f}; {sys.argv[2]}")
PY
