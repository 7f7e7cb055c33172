#!/usr/bin/env bash
# The GPU check in one call, for a machine with an NVIDIA GPU where CuPy (and optionally
# PyTorch) is already installed: installs nothing and needs no network. Runs the GPU tests,
# the kernels under compute-sanitizer (when it is there), then the GPU benchmark at
# its default sizes, and prints a short table. Expect 3-6 minutes on an H200.
#   bash scripts/gpu_check.sh [OUTDIR]
# Logs and bench.json go to OUTDIR (default: $OUT, else /tmp/linattn-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/linattn-gpu}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv 2>&1 | tee "$out/device.txt"
$py -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)" \
    2>&1 | tee -a "$out/device.txt"

timeout 240 $py -m pytest -m gpu -q -p no:cacheprovider --durations=5 2>&1 | tee "$out/tests.log"
tests=${PIPESTATUS[0]}

# every kernel once on small shapes (two chunks, ragged tiles), under memcheck and racecheck
smoke='
import cupy as cp, linattn
q, k, v = (cp.random.standard_normal((2, 130, 70)) for _ in range(3))
for method in ("linear", "chunked"):
    linattn.linear_attention_backward(v, q, k, v, causal=True, method=method)
linattn.softmax_attention_backward(v, q, k, v, causal=True)
linattn.linear_attention_step(q[:, 0], k[:, 0], v[:, 0])
cp.cuda.Device().synchronize()
print("smoke run done")'
sanitize=0
if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
        timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $py -c "$smoke" \
            2>&1 | tail -n 4 | tee "$out/sanitizer-$tool.log"
        (( PIPESTATUS[0] == 0 )) || sanitize=1
    done
else
    echo "compute-sanitizer not found: skipped" | tee "$out/sanitizer.log"
fi

timeout 240 $py -m linattn.lab.bench.gpu --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
bench=${PIPESTATUS[0]}

echo "== exit codes: tests $tests, sanitizer $sanitize, benchmark $bench (logs in $out)"
grep -E "passed|failed|error" "$out/tests.log" | tail -n 1
grep -E "^ +(16384|65536|262144|1048576) " "$out/bench.log"
grep -E "RNN step|took" "$out/bench.log"
exit $(( tests != 0 || sanitize != 0 || bench != 0 ))
