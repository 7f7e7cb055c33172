"""The performance page's sections on how the library runs, not how fast: the thread
settings of ``linattn.threads`` and the rule by which the Numba backend's method "auto" picks
a form (``linattn.dispatch``), each with the benchmark's related measurements.
"""
from .. import dispatch, threads
from .figures import read_csv
from .page_format import _ms, _sig, _table


THREADS_TEXT = """\
A model alternates BLAS matrix products with Numba's parallel loops, and both keep a pool of
threads. A thread that spins after its work holds a core the other pool needs, so the
command-line entry points and the lab set three variables where the environment does not
(`linattn.threads`; `import linattn` sets nothing; `python -m linattn.threads` prints those
the environment lacks):

{settings}

- `OMP_WAIT_POLICY`: the compiled loops' OpenMP threads sleep when their loop ends instead
  of spinning.
- `GOMP_SPINCOUNT`: they first spin briefly, so that the many short loops of a generated
  token do not each wake sleeping threads. A user who sets either OpenMP variable keeps both
  as they are.
- `OPENBLAS_THREAD_TIMEOUT`: OpenBLAS's threads stop spinning soon after a product instead
  of after its long default. Each OpenBLAS (NumPy's, and SciPy's, which Numba's products
  call) reads it once, when it loads, which is why the entry points relaunch themselves once
  with the settings in their environment.

The benchmarks' peers run with the thread settings as the user had them
(`linattn.threads.user_environment`). `python -m linattn.lab.bench.train_step` measures a
training step with the settings (its table above, when the run has it)."""


def _threads(bench):
    settings = "\n".join(f"    {k}={v}" for k, v in threads.SETTINGS.items())
    text = "## Thread settings\n\n" + THREADS_TEXT.format(settings=settings)
    t = (bench or {}).get("threads")
    if t and all(t.get(k) for k in ("one_s", "all_s", "blas_one_s", "blas_all_s")):
        body = [["causal forward, heads = 1", _sig(t["one_s"] * 1e3), _sig(t["all_s"] * 1e3),
                 _sig(t["one_s"] / t["all_s"])],
                ["NumPy float32 matmul (the yardstick)", _sig(t["blas_one_s"] * 1e3),
                 _sig(t["blas_all_s"] * 1e3), _sig(t["blas_one_s"] / t["blas_all_s"])]]
        date = (bench.get("machine") or {}).get("date", "date not recorded")
        text += (f"\n\nOne thread against {t['threads']}, in turn, in the benchmark of {date} "
                 "(milliseconds, best of the calls):\n\n"
                 + _table(["call", "1 thread", f"{t['threads']} threads", "speed-up"], body))
    return text


def _auto(figures_dir, bench=None):
    """The rule's kernel-matrix lengths for each D; the blocks against the running-sum loops
    (``data/bench_crossover.csv``); the forms it chooses between for a decay and the delta
    rule (``data/bench_auto_rules.csv``), and which was fastest at each N. Both files are
    written by the benchmark of ``bench``."""
    date = ((bench or {}).get("machine") or {}).get("date", "date not recorded")
    rule = dispatch.AUTO_METHOD["linear", "numba"]
    widths = (16, 32, 64, 128)
    body = []
    for causal in (True, False):
        longest = [max((n for n in range(1, 4097)
                        if rule(causal, (n, d), frozenset()) == "quadratic"), default=0)
                   for d in widths]
        body.append(["causal" if causal else "non-causal"] + [str(n) for n in longest])
    text = ["## The Numba backend's method \"auto\"", "",
            "On the Numba backend, `method=\"auto\"` computes short sequences as blocks of the "
            "N x N kernel matrix (`\"quadratic\"`: matrix products, no state) and longer ones "
            "in blocks of positions carrying the state (`\"chunked\"`). The rule in "
            "`linattn/dispatch.py` gives, for each D, the "
            "longest N computed as the kernel matrix:", "",
            _table(["", *(f"D = {d}" for d in widths)], body)]
    path = figures_dir / "data" / "bench_crossover.csv"
    if path.exists():
        text += ["", "The blocks against the paper's running sums as plain compiled loops "
                 f"(`{path.name}`, the benchmark of {date}; best times, ms), the timings "
                 "behind running long sequences in blocks. The kernel matrix's lengths above "
                 "are not timed here.", "", _timings(path, "D = M"), "",
                 _loops_faster(read_csv(path)[0])]
    path = figures_dir / "data" / "bench_auto_rules.csv"
    if path.exists():
        rows = read_csv(path)[0]
        text += ["", "With a decay (0.99 here; a log gate and `normalize=False` take the same "
                 "forms), method \"auto\" on Numba runs the gated running sums "
                 "(`numba_cpu.decay_loops`, the only gated Numba kernel; the rule: "
                 "`dispatch.GATED`) rather than NumPy's chunked form; for the delta rule it runs "
                 "the compiled WY chunks rather than the compiled scan. The forms timed "
                 f"against each other, NumPy's chunks too (`{path.name}`, the benchmark of "
                 f"{date}; batch 1, best times, ms):", "", _timings(path, "D"),
                 "", _fastest(rows)]
    return "\n".join(text)


def _timings(path, width):
    """A benchmark CSV's best forward and forward + backward times (ms), a row per case."""
    cells = [[r.get("case"), r.get("heads", "-"), r.get("width", "-"), r.get("n"),
              _sig(_ms(r.get("forward_best_s"))), _sig(_ms(r.get("forward_backward_best_s")))]
             for r in read_csv(path)[0]]
    return _table(["case", "heads", width, "N", "forward", "forward + backward"], cells,
                  ["---", "---:", "---:", "---:", "---:", "---:"])


def _loops_faster(rows):
    """One sentence: where in ``bench_crossover.csv``'s rows the loops were faster than the
    blocks (each family, causal or not, at each number of heads; forward, and forward +
    backward), measured, not assumed."""
    times = {}
    for r in rows:
        loops = r["case"].endswith(" loops")
        for key, what in (("forward_best_s", "forward"),
                          ("forward_backward_best_s", "forward + backward")):
            if r.get(key) not in (None, ""):
                times.setdefault((r["case"].split()[0], what, r.get("heads")), {})[loops] = (
                    float(r[key]))
    faster = [f"{family} {what} at {heads} head{'s' if str(heads) != '1' else ''}"
              for (family, what, heads), pair in times.items()
              if len(pair) == 2 and pair[True] < pair[False]]
    if not times:
        return ""
    if not faster:
        return "In this run the blocks were faster in every comparison."
    return "In this run the loops were faster in: " + "; ".join(faster) + "."


def _fastest(rows):
    """One sentence: the fastest form (forward + backward) of each family (the case's first
    word) at each N in ``bench_auto_rules.csv``'s rows, measured, not assumed."""
    best = {}
    for r in rows:
        seconds = r.get("forward_backward_best_s")
        if seconds in (None, ""):
            continue
        key = (int(r["n"]), r["case"].split()[0])
        if key not in best or float(seconds) < best[key][1]:
            best[key] = (r["case"], float(seconds))
    if not best:
        return ""
    ns = sorted({n for n, _ in best})
    parts = [f"at N = {n}, " + ", ".join(case for (m, _), (case, _) in sorted(best.items())
                                          if m == n) for n in ns]
    return "Fastest forward + backward in that run: " + "; ".join(parts) + "."
