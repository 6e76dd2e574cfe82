#!/usr/bin/env bash
# The GPU tier: tests/gpu on this machine's GPU (bf16-mixed, NCCL under strategy=ddp), then the GPU benchmarks,
# with a short report. CI never runs it (it has no GPU); run it on a GPU machine, or in the CUDA image:
#   bash tools/gpu_check.sh [REPORT_DIR]                      # default outputs/gpu_check
#   docker run --rm --gpus all --entrypoint bash kglightning tools/gpu_check.sh
#   KGLIGHTNING_GPU_TIER_ON_CPU=1 bash tools/gpu_check.sh     # dry run of the tier's own code on the CPU (gloo, no
#                                                             # faiss-gpu): it shows nothing about GPUs
# The report (REPORT_DIR/report.md) names the device and versions, lists every test with its outcome, and holds the
# benchmark table for BENCHMARKS.md. Exit status: pytest's.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-outputs/gpu_check}
mkdir -p "$out"
report="$out/report.md"
export HF_HUB_OFFLINE=1 WANDB_MODE=offline
# the interpreter: $PYTHON, else python3 (the CUDA images have no plain `python`), else python
py=${PYTHON:-$(command -v python3 || command -v python)}
{
    echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/- GPU: /' \
        || echo "- GPU: none (nvidia-smi not found)"
    "$py" - <<'PY'
import importlib.util
import torch
print(f"- torch {torch.__version__}, CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}, "
      f"NCCL: {torch.distributed.is_nccl_available()}")
faiss = importlib.util.find_spec("faiss") is not None
if faiss:
    import faiss as f
    print(f"- faiss {f.__version__}, GPUs it sees: {f.get_num_gpus() if hasattr(f, 'get_num_gpus') else 0}")
else:
    print("- faiss: not installed")
PY
    [ "${KGLIGHTNING_GPU_TIER_ON_CPU:-0}" = 1 ] && echo "- DRY RUN on the CPU (KGLIGHTNING_GPU_TIER_ON_CPU=1): no GPU was used"
    echo
} > "$report"
# a report section from a pytest log (-rA): each test's outcome, then pytest's summary line
section() {  # TITLE LOG
    echo "## $1"
    echo
    grep -E '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ' "$2" | sed 's/^/- /'
    tail -n 1 "$2" | sed 's/^/- summary: /'
    echo
}
cuda() { "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; }
"$py" -m pytest tests/gpu -m gpu -o addopts="" --strict-markers -p no:cacheprovider -q -rA --junitxml "$out/gpu_tier.xml" 2>&1 | tee "$out/pytest.log"
status=${PIPESTATUS[0]}
section "tests/gpu (pytest exit status $status)" "$out/pytest.log" >> "$report"
# the guard as a service on the GPU: the server tests with the server and predict on cuda (issue 60)
if cuda; then
    KGLIGHTNING_TEST_SERVE_ACCELERATOR=cuda "$py" -m pytest tests/serve/test_server.py -o addopts="" -p no:cacheprovider \
        -q -rA 2>&1 | tee "$out/serve.log"
    serve_status=${PIPESTATUS[0]}
    section "tests/serve/test_server.py on cuda (pytest exit status $serve_status)" "$out/serve.log" >> "$report"
    [ "$serve_status" = 0 ] || status=$serve_status
fi
if cuda; then
    { echo "## Benchmarks (tools/bench/bench_gpu.py)"; echo; "$py" tools/bench/bench_gpu.py ${GPU_BENCH_ARGS:-}; } >> "$report" 2>&1
else
    { echo "## Benchmarks"; echo; echo "skipped: no CUDA device"; } >> "$report"
fi
echo "report: $report"
cat "$report"
exit "$status"
