#!/usr/bin/env bash
# Wall time of the README's main job (`./bench.sh demo`) on a fresh BENCH_HOME, against the
# 10-minute goal for build + offline mismatch + pg-seq-is with nvfp4, fp16 and bf16 rollouts (two jobs) + the report.
#   bash benchmarks/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# a fresh store; the environment's set-up is included only when .venv does not exist yet
export BENCH_HOME=$(mktemp -d)
start=$(date +%s)
./bench.sh demo
end=$(date +%s)
wall=$((end - start))
python3 - "$wall" <<'PY'
import sys
w = int(sys.argv[1])
print(f"demo wall time {w} s ({w / 60:.1f} min); goal 600 s → ratio {w / 600:.2f}")
PY
