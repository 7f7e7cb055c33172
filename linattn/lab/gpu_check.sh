#!/usr/bin/env bash
# The GPU check in one call, sized for a device lent for minutes: on a fresh machine with an
# NVIDIA GPU where CuPy (and optionally PyTorch) is installed, with no network. Every step runs
# under its own `timeout` (the limits below add up to under 480 s), keeps its whole log in
# OUTDIR/<step>.log, and a slow or failing step costs only itself:
#   device     the GPU, driver and versions
#   warmup     compiles every CUDA module once (NVRTC, both dtypes) and CuPy's own kernels,
#              and reports the compile times; later steps read CuPy's on-disk cache
#   tests      pytest tests/test_cuda.py -m gpu: only the CUDA module is collected, and its CPU
#              references run on NumPy (backend="numpy"), so Numba compiles nothing
#   memcheck, racecheck, synccheck
#              compute-sanitizer on the smoke run below, CuPy's memory pool off, only our
#              kernels instrumented; memcheck first proves it sees an out-of-bounds write
#   bench      the GPU benchmark, last
# and prints a table of each step's exit code and seconds (also OUTDIR/summary.txt).
#   bash linattn/lab/gpu_check.sh [OUTDIR]      (OUTDIR: default $OUT, else /tmp/linattn-gpu)
# Without a GPU (or with GPU_CHECK_DRY_RUN=1) every GPU step prints a skip line; exit 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/linattn-gpu}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
export GPU_CHECK_PY=$py

# Every kernel once on small shapes (two chunks, ragged tiles), both dtypes, the plain and the
# compensated step, with CuPy's memory pool off: each array is its own cudaMalloc, so memcheck
# sees its true bounds. With the argument "out-of-bounds": a write one past an array, which
# memcheck must report (the control that the filter and the allocator let it see our kernels).
export GPU_CHECK_SMOKE='
import sys, time
import cupy as cp
cp.cuda.set_allocator(None)
cp.cuda.set_pinned_memory_allocator(None)
import linattn
if sys.argv[1:] == ["out-of-bounds"]:
    probe = cp.RawKernel(r"""extern "C" __global__ void rnn_step_probe(float* x, int n)
                             { x[n + threadIdx.x] = 1; }""", "rnn_step_probe")
    x = cp.zeros(256, cp.float32)
    probe((1,), (32,), (x, cp.int32(256)))
    cp.cuda.Device().synchronize()
    sys.exit(0)
start = time.perf_counter()
for dtype in (cp.float32, cp.float64):
    rng = cp.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 130, 70), dtype=dtype) for _ in range(3))
    for method in ("linear", "chunked"):
        linattn.linear_attention_backward(v, q, k, v, causal=True, method=method)
    linattn.softmax_attention_backward(v, q, k, v, causal=True)
    linattn.linear_attention_step(q[:, 0], k[:, 0], v[:, 0])
    for compensated in (False, True):
        rnn = linattn.Recurrence((2,), 70, 70, backend="cupy", dtype=dtype,
                                 compensated=compensated)
        rnn.step(q[:, 0], k[:, 0], v[:, 0])
cp.cuda.Device().synchronize()
print(f"smoke run done in {time.perf_counter() - start:.1f} s")'

export GPU_CHECK_WARMUP='
import re, time
start = time.perf_counter()
import cupy
from linattn.cuda import launch
print(f"import cupy: {time.perf_counter() - start:.1f} s")
for source in launch.SOURCES:
    names = re.findall(r"__global__ void(?: __launch_bounds__\(\w+\))?\s+(\w+)\(",
                       launch.source_path(source).read_text())
    for dtype in ("float32", "float64"):
        t = time.perf_counter()
        for name in names:
            launch.kernel(source, name, dtype)
        print(f"compiled {source} {dtype} ({len(names)} kernels): "
              f"{time.perf_counter() - t:.1f} s", flush=True)
t = time.perf_counter()
exec(compile(__import__("os").environ["GPU_CHECK_SMOKE"], "smoke", "exec"))
print(f"smoke run with its first CuPy kernels: {time.perf_counter() - t:.1f} s")
print(f"warm-up total: {time.perf_counter() - start:.1f} s")'

# our kernels: the sanitizers instrument these and no library kernel. Each is a substring of
# a kernel's name (kns=, one --kernel-name each), not a regular expression.
export GPU_CHECK_KERNELS='rnn_step chunk_ scan_product softmax_rows'

if [[ ${GPU_CHECK_DRY_RUN:-0} == 1 ]]; then
    gpu=no why="dry run (GPU_CHECK_DRY_RUN=1)"
elif ! nvidia-smi -L >/dev/null 2>&1; then
    gpu=no why="no NVIDIA GPU (nvidia-smi -L failed)"
elif ! $py -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0" >/dev/null 2>&1
then
    gpu=no why="CuPy cannot reach the GPU"
else
    gpu=yes why=""
fi
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
export GPU_CHECK_SANITIZER=$sanitizer
bench_module=""
for module in linattn.lab.bench.gpu; do
    path=${module//.//}
    if [[ -f $path.py || -f $path/__main__.py ]]; then bench_module=$module; break; fi
done

# the embedded Python must at least parse, GPU or not
$py -c 'import os; [compile(os.environ[k], k, "exec") for k in ("GPU_CHECK_SMOKE",
                                                                 "GPU_CHECK_WARMUP")]' || exit 2

names=() codes=() seconds=()
# skip NAME REASON: the step's line in the table, and its skip line in OUTDIR/NAME.log
skip() {
    echo "== $1: skipped, $2" | tee "$out/$1.log"
    names+=("$1") codes+=(skipped) seconds+=(0)
}

# step NAME LIMIT_S COMMAND: run the bash COMMAND under `timeout LIMIT_S`, its whole output
# in OUTDIR/NAME.log and on the terminal; without a GPU, its skip line instead.
step() {
    local name=$1 limit=$2 command=$3 start=$SECONDS code
    if [[ $gpu != yes ]]; then              # a dry run still checks the command's syntax
        bash -n -c "$command" || { names+=("$name") codes+=(syntax) seconds+=(0); return; }
        skip "$name" "$why"
        return
    fi
    echo "== $name (limit $limit s)" | tee "$out/$name.log"
    timeout -k 5 "$limit" bash -c "$command" 2>&1 | tee -a "$out/$name.log"
    code=${PIPESTATUS[0]}
    if (( code == 124 || code == 137 )); then
        echo "== $name: timed out after $limit s" | tee -a "$out/$name.log"
    fi
    names+=("$name") codes+=("$code") seconds+=($((SECONDS - start)))
}

# sanitize TOOL [OPTION...]: compute-sanitizer TOOL on the smoke run, our kernels only
sanitize() {
    local tool=$1; shift
    local filters="" name
    for name in $GPU_CHECK_KERNELS; do filters+=" --kernel-name kns=$name"; done
    echo "\$GPU_CHECK_SANITIZER --tool $tool --error-exitcode 9 $*$filters \
\$GPU_CHECK_PY -c \"\$GPU_CHECK_SMOKE\""
}
control="$(sanitize memcheck) out-of-bounds
if (( \$? != 9 )); then echo 'memcheck missed the out-of-bounds probe: it is blind'; exit 8; fi
echo 'memcheck reported the out-of-bounds probe, as it must'"

step device 10 "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,\
clocks.max.mem --format=csv; \$GPU_CHECK_PY -c 'import cupy, numpy, sys; \
print(sys.version); print(\"cupy\", cupy.__version__, \"numpy\", numpy.__version__)'"
step warmup 80 "\$GPU_CHECK_PY -c \"\$GPU_CHECK_WARMUP\""
step tests 180 "\$GPU_CHECK_PY -m pytest tests/test_cuda.py -m gpu -q -p no:cacheprovider \
--durations=15 --junitxml '$out/tests.xml'"
for tool in memcheck racecheck synccheck; do
    if [[ $gpu == yes && -z $sanitizer ]]; then skip $tool "compute-sanitizer not found"; fi
done
if [[ $gpu != yes || -n $sanitizer ]]; then
    step memcheck 45 "$control
$(sanitize memcheck --leak-check no)"
    step racecheck 50 "$(sanitize racecheck)"
    step synccheck 30 "$(sanitize synccheck)"
fi
if [[ $gpu == yes && -z $bench_module ]]; then
    skip bench "no GPU benchmark module found"
else
    step bench 80 "\$GPU_CHECK_PY -m $bench_module --json '$out/bench.json' --budget-s 4 \
--repeat 5"
fi

failed=0
for i in "${!names[@]}"; do
    [[ ${codes[$i]} == 0 || ${codes[$i]} == skipped ]] || failed=1
done
{
    printf "%-10s %8s %8s\n" step exit seconds
    for i in "${!names[@]}"; do
        printf "%-10s %8s %8s\n" "${names[$i]}" "${codes[$i]}" "${seconds[$i]}"
    done
    echo "logs in $out${why:+; no GPU step ran: $why}"
} | tee "$out/summary.txt"
if [[ $gpu == yes ]]; then                  # the headlines, from the whole logs
    grep -hE "(passed|failed|error).* in [0-9.]+s" "$out/tests.log"
    grep -hE "^ +(16384|65536|262144|1048576) |RNN step|took" "$out/bench.log"
fi
exit $failed
