#!/usr/bin/env bash
# The GPU check of the Triton transition-head kernels, in one go (no network, no vLLM needed;
# torch + triton on a CUDA machine):
#   1. the parity tests natively on the GPU (tests/test_kernels.py, and tests/test_sequential.py's
#      CUDA-graph replay of the block; `cuda`-marked tests; python -m kernels.parity --device
#      cuda directly if pytest is not installed),
#   2. the full micro-benchmark (benchmarks/bench_kernels.py): single steps eager and as CUDA
#      graph replays, the top-k path, and whole 7-step draft blocks; BENCH_ARGS="--host" adds
#      each path's per-call host cost (README, "Triton kernels on a GPU", has one run's results),
#   3. the one-time cost of the CUDA-graph blocks (benchmarks/block_graph_cost.py): each padded
#      batch's capture time and the GPU memory its graph keeps.
# Results go to $OUT if set, else benchmarks/results/:  kernels_env.txt, kernels_tests.txt,
# kernels.json, kernels.md, kernels_bench.log, block_graph_cost.{json,md}.
# Knobs: PYTHON (interpreter; default .venv/bin/python, else python3), BENCH_ARGS (extra
# benchmark flags, e.g. --quick), TEST_TIMEOUT / BENCH_TIMEOUT / COST_TIMEOUT (seconds,
# default 300 / 420 / 180).
# Exit status: non-zero if the tests or a benchmark failed.
set -uo pipefail

cd "$(dirname "$0")/.."
RESULTS="${OUT:-benchmarks/results}"
mkdir -p "$RESULTS"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
unset TRITON_INTERPRET  # the kernels must compile for the GPU, not run in the interpreter
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_DEFAULT_FP_FUSION=1

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
        --format=csv 2>&1 || echo "nvidia-smi unavailable"
    "$PYTHON" - <<'EOF'
import torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA DEVICE")
EOF
} 2>&1 | tee "$RESULTS/kernels_env.txt"

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device visible to torch: nothing to check" | tee -a "$RESULTS/kernels_env.txt"
    exit 2
fi

echo "== parity tests on the GPU"
if "$PYTHON" -c "import pytest" 2>/dev/null; then
    timeout "${TEST_TIMEOUT:-300}" "$PYTHON" -m pytest -q -m cuda -p no:cacheprovider \
        tests/test_kernels.py tests/test_sequential.py 2>&1 | tee "$RESULTS/kernels_tests.txt"
    tests_rc=${PIPESTATUS[0]}
else
    echo "(no pytest: running kernels.parity directly)" | tee "$RESULTS/kernels_tests.txt"
    DSPARK_KERNEL_POISON=1 timeout "${TEST_TIMEOUT:-300}" "$PYTHON" -m kernels.parity \
        --device cuda 2>&1 | tee -a "$RESULTS/kernels_tests.txt"
    tests_rc=${PIPESTATUS[0]}
fi
echo "tests exit status: $tests_rc" | tee -a "$RESULTS/kernels_tests.txt"

echo "== micro-benchmark"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
timeout "${BENCH_TIMEOUT:-420}" "$PYTHON" benchmarks/bench_kernels.py --device cuda \
    --out "$RESULTS/kernels" ${BENCH_ARGS:-} 2>&1 | tee "$RESULTS/kernels_bench.log"
bench_rc=${PIPESTATUS[0]}
echo "benchmark exit status: $bench_rc" | tee -a "$RESULTS/kernels_bench.log"

echo "== CUDA-graph block cost"
timeout "${COST_TIMEOUT:-180}" "$PYTHON" benchmarks/block_graph_cost.py \
    --out "$RESULTS/block_graph_cost" 2>&1 | grep -v '^{'
cost_rc=${PIPESTATUS[0]}
echo "block_graph_cost exit status: $cost_rc"

[[ $tests_rc -eq 0 && $bench_rc -eq 0 && $cost_rc -eq 0 ]]
