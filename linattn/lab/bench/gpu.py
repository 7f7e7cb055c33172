"""GPU benchmark of the CuPy backend: causal linear attention forward and forward+backward
versus N, timed with CUDA events, against PyTorch's causal ``scaled_dot_product_attention``
and a plain PyTorch cumulative-sum linear attention when torch is importable; the batched
RNN step; achieved GFLOP/s and GB/s against the device's peaks.

    python -m linattn.lab.bench.gpu [--max-log2-n 20] [--json results.json]

Counts: forward 4 N D M flops per head (Eq. 9-12: the state update and the readout, 2 N D M
each); forward+backward 12 N D M (the backward's four products added); bytes are each input
read once and each output written once. Medians of ``--repeat`` runs after two warm-ups.
"""
import argparse
import json
import statistics
import time

import numpy as np

from ..._cli_types import Parser, new_file, positive_float, positive_int
from ...cuda import chunked, cumulative, launch, step
from ...feature_maps import EluPlusOne
from ...forms.recurrent import zero_state
from ...linear import linear_attention, linear_attention_backward

FP32_LANES = {"80": 64}      # FP32 lanes per multiprocessor; 128 on sm_86 and newer
# SXM datasheet peaks (float32 GFLOP/s, GB/s), used where the driver reports no clocks
DATASHEET = {"H200": (66900.0, 4800.0), "H100": (66900.0, 3350.0)}


def device_peaks(cupy, copy_bytes=2**31):
    """Name, peak float32 GFLOP/s (multiprocessors x FP32 lanes x 2 x clock), peak GB/s
    (2 x memory clock x bus width), and a measured device-to-device copy in GB/s (bytes read
    plus bytes written)."""
    dev = cupy.cuda.Device()
    attrs = dev.attributes
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    lanes = FP32_LANES.get(dev.compute_capability, 128)
    sms = attrs.get("MultiProcessorCount") or props.get("multiProcessorCount", 0)
    clock_khz = attrs.get("ClockRate") or props.get("clockRate", 0)
    mem_khz = attrs.get("MemoryClockRate") or props.get("memoryClockRate", 0)
    bus_bits = attrs.get("GlobalMemoryBusWidth") or props.get("memoryBusWidth", 0)
    peaks = {"name": name, "compute_capability": dev.compute_capability,
             "peak_gflops_fp32": sms * lanes * 2 * clock_khz / 1e6,
             "peak_gbs": 2 * mem_khz * bus_bits / 8 / 1e6, "peaks_from": "device attributes"}
    sheet = next((v for k, v in DATASHEET.items() if k in name), None)
    if sheet and not (peaks["peak_gflops_fp32"] and peaks["peak_gbs"]):
        peaks.update(peak_gflops_fp32=sheet[0], peak_gbs=sheet[1], peaks_from="datasheet")
    a = cupy.ones(copy_bytes // 4, dtype=cupy.float32)
    b = cupy.empty_like(a)
    peaks["copy_gbs"] = 2 * a.nbytes / time_gpu(cupy, lambda: cupy.copyto(b, a), 10) / 1e6
    return peaks


def time_gpu(cupy, fn, repeat):
    """Median milliseconds of ``fn()`` between CUDA events on the (legacy) default stream,
    which also orders PyTorch's default stream, after two warm-up calls."""
    for _ in range(2):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def linattn_cases(q, k, v, dout):
    """name -> (forward, forward+backward) closures for linattn on CuPy arrays (..., N, D):
    the v2 and v1 kernels on features, and the public functions with the elu+1 map."""
    phi = EluPlusOne()
    fq, fk = phi.forward(q), phi.forward(k)
    kw = dict(causal=True, eps=1e-6)
    cases = {
        "linattn v2 kernel": (lambda: chunked.attend(fq, fk, v, **kw),
                              lambda: chunked.attend_backward(dout, fq, fk, v, **kw)),
        "linattn v1 kernel": (lambda: cumulative.attend(fq, fk, v, **kw),
                              lambda: cumulative.attend_backward(dout, fq, fk, v, **kw)),
        "linattn API": (lambda: linear_attention(q, k, v, causal=True),
                        lambda: linear_attention_backward(dout, q, k, v, causal=True)),
    }
    # training runs the forward for the loss, then the backward (which recomputes the states)
    return {name: (fwd, lambda fwd=fwd, bwd=bwd: (fwd(), bwd()))
            for name, (fwd, bwd) in cases.items()}


def torch_cases(q, k, v, dout):
    """name -> (forward, forward+backward) closures for the PyTorch peers, or {} without torch."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    tq, tk, tv, tdout = (torch.as_tensor(x, device="cuda") for x in (q, k, v, dout))
    grads = [x.detach().clone().requires_grad_(True) for x in (tq, tk, tv)]

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def cumsum_linear(q, k, v, eps=1e-6):
        phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
        s = torch.einsum("bhnf,bhnm->bhnfm", phi_k, v).cumsum(dim=2)    # S_i, Eq. (10)
        num = torch.einsum("bhnf,bhnfm->bhnm", phi_q, s)
        den = torch.einsum("bhnf,bhnf->bhn", phi_q, phi_k.cumsum(dim=2)) + eps
        return num / den[..., None]

    def both(fn):
        def fwd():
            with torch.no_grad():
                fn(tq, tk, tv)

        def fwd_bwd():
            fn(*grads).backward(tdout)
        return fwd, fwd_bwd
    return {"torch sdpa causal": both(sdpa), "torch cumsum linear": both(cumsum_linear)}


GROWTH = {"torch sdpa causal": 2}      # time ~ N^2; everything else ~ N


def bench_sizes(cupy, sizes, heads, dim, repeat, budget_s):
    """Rows of {N, impl, fwd_ms, fwd_bwd_ms, ...}; a measurement predicted (from the previous
    size) to take over ``budget_s`` or that runs out of memory is skipped and noted."""
    rows, last = [], {}
    rng = cupy.random.default_rng(0)
    for n in sizes:
        q, k, v, dout = (rng.standard_normal((1, heads, n, dim), dtype=np.float32)
                         for _ in range(4))
        cases = {**linattn_cases(q, k, v, dout), **torch_cases(q, k, v, dout)}
        for name, (fwd, fwd_bwd) in cases.items():
            row = {"N": n, "impl": name}
            if name in last:
                n0, t0 = last[name]
                predicted = t0 * (n / n0) ** GROWTH.get(name, 1) * (repeat + 2) / 1e3
                if predicted > budget_s:
                    rows.append({**row, "skipped": f"predicted {predicted:.0f} s"})
                    print(format_row(rows[-1]), flush=True)
                    continue
            try:
                row["fwd_ms"] = time_gpu(cupy, fwd, repeat)
                row["fwd_bwd_ms"] = time_gpu(cupy, fwd_bwd, repeat)
            except out_of_memory(cupy) as err:
                row["skipped"] = f"out of memory: {type(err).__name__}"
            free_memory(cupy)
            if "fwd_bwd_ms" in row:
                last[name] = (n, row["fwd_bwd_ms"])
                flops = 4 * n * dim * dim * heads
                row["fwd_gflops"] = flops / row["fwd_ms"] / 1e6
                row["fwd_bwd_gflops"] = 3 * flops / row["fwd_bwd_ms"] / 1e6
                row["fwd_gbs"] = 4 * n * dim * heads * 4 / row["fwd_ms"] / 1e6
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def out_of_memory(cupy):
    """The out-of-memory exceptions of CuPy and (if installed) PyTorch."""
    try:
        import torch
        return cupy.cuda.memory.OutOfMemoryError, torch.cuda.OutOfMemoryError
    except ImportError:
        return (cupy.cuda.memory.OutOfMemoryError,)


def free_memory(cupy):
    cupy.get_default_memory_pool().free_all_blocks()
    try:
        import torch
        torch.cuda.empty_cache()
    except ImportError:
        pass


def bench_step(cupy, batch, heads, dim, repeat):
    """The batched RNN step: time, and GB/s for reading and writing the states."""
    rng = np.random.default_rng(1)
    b = (batch, heads)
    q, k = (cupy.asarray(np.abs(rng.standard_normal((*b, dim), dtype=np.float32)))
            for _ in range(2))
    v = cupy.asarray(rng.standard_normal((*b, dim), dtype=np.float32))
    state = zero_state(b, dim, dim, np.float32, cupy)
    ms = time_gpu(cupy, lambda: step.step(q, k, v, state, 1e-6), repeat)
    moved = 2 * (state.S.nbytes + state.z.nbytes) + q.nbytes + k.nbytes + 2 * v.nbytes
    return {"batch": batch, "heads": heads, "dim": dim, "ms": ms, "gbs": moved / ms / 1e6}


def format_row(row):
    if "skipped" in row:
        return f"{row['N']:>8}  {row['impl']:<22} skipped: {row['skipped']}"
    return (f"{row['N']:>8}  {row['impl']:<22} fwd {row['fwd_ms']:9.3f} ms "
            f"{row['fwd_gflops']:8.0f} GFLOP/s   fwd+bwd {row['fwd_bwd_ms']:9.3f} ms")


def summary(rows, step_row, peaks):
    """The headline ratios of the run (None where a number is missing)."""
    def ms(impl, n, key="fwd_bwd_ms"):
        return next((r.get(key) for r in rows if r["impl"] == impl and r["N"] == n), None)

    def ratio(a, b):
        return a / b if a and b else None
    ours = ms("linattn v2 kernel", 2**16)
    big = next((r for r in rows if r["impl"] == "linattn v2 kernel" and r["N"] == 2**20), {})
    return {
        "sdpa / v2 fwd+bwd at N=65536": ratio(ms("torch sdpa causal", 2**16), ours),
        "torch cumsum / v2 fwd+bwd at N=65536":
            ratio(ms("torch cumsum linear", 2**16), ours),
        "v2 fwd GFLOP/s / fp32 peak at N=2^20":
            ratio(big.get("fwd_gflops"), peaks["peak_gflops_fp32"]),
        "step GB/s / peak GB/s": ratio(step_row["gbs"], peaks["peak_gbs"]),
        "step GB/s / measured copy GB/s": ratio(step_row["gbs"], peaks["copy_gbs"]),
    }


def main(argv=None):
    parser = Parser(prog="python -m linattn.lab.bench.gpu", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-log2-n", type=positive_int, default=20,
                        help="largest N = 2^this")
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--dim", type=positive_int, default=64, help="D = M")
    parser.add_argument("--repeat", type=positive_int, default=10)
    parser.add_argument("--budget-s", type=positive_float, default=20.0,
                        help="skip a measurement predicted to take longer than this")
    parser.add_argument("--step-batch", type=positive_int, default=1024,
                        help="sequences in the step")
    parser.add_argument("--peak-gflops", type=positive_float,
                        help="override the float32 peak")
    parser.add_argument("--peak-gbs", type=positive_float,
                        help="override the memory bandwidth peak")
    parser.add_argument("--json", type=new_file, help="write all numbers to this file")
    args = parser.parse_args(argv)
    cupy = launch.require_cupy()
    started = time.perf_counter()
    peaks = device_peaks(cupy)
    if args.peak_gflops:
        peaks.update(peak_gflops_fp32=args.peak_gflops, peaks_from="command line")
    if args.peak_gbs:
        peaks.update(peak_gbs=args.peak_gbs, peaks_from="command line")
    print(json.dumps(peaks), flush=True)
    sizes = [2**p for p in range(10, args.max_log2_n + 1, 2)]
    if sizes[-1] != 2**args.max_log2_n:
        sizes.append(2**args.max_log2_n)
    rows = bench_sizes(cupy, sizes, args.heads, args.dim, args.repeat, args.budget_s)
    step_row = bench_step(cupy, args.step_batch, args.heads, args.dim, args.repeat * 5)
    print(f"RNN step, {step_row['batch']} x {step_row['heads']} states of {args.dim} x "
          f"{args.dim}: {step_row['ms'] * 1e3:.1f} us, {step_row['gbs']:.0f} GB/s")
    ratios = summary(rows, step_row, peaks)
    for name, value in ratios.items():
        print(f"{name}: {'n/a' if value is None else f'{value:.2f}'}")
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": peaks, "rows": rows, "step": step_row, "summary": ratios},
                      out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
