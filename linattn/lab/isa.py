"""The instruction set a measurement ran with, and an AVX2 mode for any x86 machine.

Numba compiles for the CPU it runs on, and OpenBLAS picks its kernel for it too: on an
AVX-512 machine both use 512-bit vectors, which most students' machines lack (consumer Intel
CPUs since 2021, AMD before Zen 4). The AVX2 mode holds every side of a benchmark to the
Haswell instruction set through the variables each library reads when it loads:

- Numba: ``NUMBA_CPU_NAME=haswell`` and ``NUMBA_CPU_FEATURES`` (Haswell's features, AVX-512
  off; without the features Numba would keep the host's). Its disk cache is keyed by the CPU
  name and features, so the two modes never share compiled code.
- OpenBLAS (NumPy's BLAS): ``OPENBLAS_CORETYPE=Haswell``.
- The peers: ``ATEN_CPU_CAPABILITY=avx2`` (PyTorch's vectorised kernels) and
  ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (its BLAS).

All must be set before the libraries load: ``environment("avx2")`` gives them for a new
process, and ``describe()`` says what this process runs with, for a benchmark's record. ``make
figures`` runs the AVX2 mode only where it adds a measurement, on a CPU with AVX-512
(``avx2_mode_adds``): on one with AVX2 and no AVX-512 the native run is the AVX2 run.
"""
import os

MODES = ("native", "avx2")

# LLVM's Haswell: AVX2 and FMA, no AVX-512 (the features Numba passes to LLVM replace the
# host's, so each AVX-512 subset is switched off by name)
_HASWELL_FEATURES = ",".join(
    ["+64bit", "+avx", "+avx2", "+bmi", "+bmi2", "+cmov", "+cx16", "+f16c", "+fma", "+fxsr",
     "+lzcnt", "+mmx", "+movbe", "+pclmul", "+popcnt", "+sahf", "+sse", "+sse2", "+sse3",
     "+sse4.1", "+sse4.2", "+ssse3", "+xsave"]
    + [f"-{f}" for f in ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
                         "avx512vnni", "avx512bf16", "avx512fp16", "avx512vbmi",
                         "avx512vbmi2", "avx512bitalg", "avx512vpopcntdq", "avx512ifma")])

AVX2_ENVIRONMENT = {
    "NUMBA_CPU_NAME": "haswell",
    "NUMBA_CPU_FEATURES": _HASWELL_FEATURES,
    "OPENBLAS_CORETYPE": "Haswell",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}


def environment(mode, environ=None):
    """A copy of ``environ`` (default ``os.environ``) for a process that runs in ``mode``:
    "native" removes the AVX2 mode's variables, "avx2" sets them."""
    if mode not in MODES:
        raise ValueError(f"unknown instruction-set mode {mode!r}; expected one of {MODES}")
    env = dict(os.environ if environ is None else environ)
    for name in AVX2_ENVIRONMENT:
        env.pop(name, None)
    if mode == "avx2":
        env.update(AVX2_ENVIRONMENT)
    return env


def cpu_flags():
    """The vector extensions this CPU reports (/proc/cpuinfo), widest first; () elsewhere."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(f for f in ("avx512f", "avx2", "fma", "avx") if f in flags)
    except OSError:
        pass
    return ()


def avx2_mode_adds(flags=None):
    """Whether the AVX2 mode measures what the native run does not: on a CPU with AVX-512
    (``flags``: what ``cpu_flags()`` returns, by default this CPU's, or what a record kept).
    On a CPU whose widest vectors are AVX2's the native run already is an AVX2 run (Numba
    and OpenBLAS pick AVX2 code for it; only the tuning they name differs); a CPU without
    AVX2 (an ARM one, or one that reports no flags) cannot run the mode's code at all."""
    flags = cpu_flags() if flags is None else flags
    return "avx512f" in flags


def mode(environ=None):
    """"avx2" when every variable of the AVX2 mode is set as it sets them, else "native"."""
    environ = os.environ if environ is None else environ
    forced = all(environ.get(k) == v for k, v in AVX2_ENVIRONMENT.items())
    return "avx2" if forced else "native"


def numba_target():
    """(CPU name, whether AVX-512 is on) of the code Numba compiles in this process."""
    from numba.core import config
    import llvmlite.binding as llvm
    name = config.CPU_NAME or llvm.get_host_cpu_name()
    features = (config.CPU_FEATURES if config.CPU_FEATURES is not None
                else llvm.get_host_cpu_features().flatten())
    return name, "+avx512f" in features.split(",")


def describe():
    """What this process runs with, JSON-ready: the mode, the CPU's widest extensions, Numba's
    target and OpenBLAS's forced core (the kernel it picked is in ``timing.machine``)."""
    name, avx512 = numba_target()
    return {"mode": mode(), "cpu_flags": list(cpu_flags()), "numba_cpu": name,
            "numba_avx512": avx512, "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}


def label(description):
    """One short line for a caption: "AVX2 mode (numba haswell, OpenBLAS Haswell)" or
    "native (numba znver4 with AVX-512)"."""
    if description.get("mode") == "avx2":
        return (f"AVX2 mode (numba {description['numba_cpu']}, "
                f"OpenBLAS {description['openblas_coretype']})")
    vectors = "with AVX-512" if description.get("numba_avx512") else "without AVX-512"
    return f"native (numba {description.get('numba_cpu')} {vectors})"
