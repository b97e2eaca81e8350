#!/usr/bin/env bash
# Wall time of the README's main job (`./bench.sh demo`) on a fresh BENCH_HOME, against the
# 300 s goal (issue 22) for build + offline mismatch + pg-seq-is with mxfp4 and fp16 rollouts (two jobs) +
# the report, with the CPU's 16-bit flags beside it (they decide which kernels the formats run).
#   bash benchmarks/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# a fresh store; the environment's set-up is included only when .venv does not exist yet
export BENCH_HOME=$(mktemp -d)
start=$(date +%s)
./bench.sh demo
end=$(date +%s)
wall=$((end - start))
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512_bf16|avx512_fp16|amx_bf16|amx_fp16)$' | sort | tr '\n' ' ')
python3 - "$wall" "$flags" <<'PY'
import sys
w = int(sys.argv[1])
print(f"demo wall time {w} s ({w / 60:.1f} min); goal 300 s → ratio {w / 300:.2f}; CPU flags: {sys.argv[2] or '-'}")
PY
