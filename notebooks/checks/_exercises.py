"""What every notebook's exercise checks share: ``report`` runs a student's answer and says
when it is not written yet (it still raises NotImplementedError, the notebook's starting
point) instead of failing. The check modules import it as
``from ._exercises import report``; the convention is in ``checks/__init__.py``."""


def report(exercise, check, *answers):
    """Run ``check(*answers)`` and print the verdict: an answer still raising
    NotImplementedError is not attempted yet; a wrong one raises AssertionError."""
    try:
        check(*answers)
    except NotImplementedError:
        print(f"Exercise {exercise}: not attempted yet (your answer raises "
              "NotImplementedError); write it and rerun the cell.")
    else:
        print(f"Exercise {exercise}: correct")


def assert_below_n_by_n(call, n, setting, fraction, hint):
    """Run ``call()`` once, print its peak memory (``tracemalloc``) beside one N x N float64
    array, and assert the peak is below ``fraction`` of that array: ``hint`` says why not."""
    from linattn.lab.bench.timing import peak_bytes
    peak, n_by_n = peak_bytes(call), n * n * 8
    print(f"peak memory at N = {n}{setting}: {peak / 2**20:.2f} MiB "
          f"(one N x N float64 array: {n_by_n / 2**20:.0f} MiB)")
    assert peak < fraction * n_by_n, hint
