"""``numba_cpu.blas_threads``: holding SciPy's BLAS to one thread restores what it found
(nested, from several threads, after an error), and the rule that picks the tiles' sizing
from the BLAS's kernel."""
import threading
import time

import pytest
from threadpoolctl import threadpool_info

from linattn.numba_cpu import blas_threads


def scipy_blas_threads():
    """SciPy's BLAS's number of threads, as threadpoolctl reads it afresh."""
    controllers = blas_threads._controllers()
    if not controllers:
        pytest.skip("threadpoolctl finds no BLAS it can set")
    paths = {c.filepath for c in controllers}
    return {i["num_threads"] for i in threadpool_info() if i["filepath"] in paths}


@pytest.fixture
def two_threads():
    """SciPy's BLAS on two threads for the test (one would hide a missed restore)."""
    controllers = blas_threads._controllers()
    before = [(c, c.get_num_threads()) for c in controllers]
    for c in controllers:
        c.set_num_threads(2)
    if scipy_blas_threads() != {2}:
        restore(before)                      # a skip here would skip the teardown below
        pytest.skip("this BLAS will not run on two threads here")
    yield
    restore(before)


def restore(before):
    for c, threads in before:
        c.set_num_threads(threads)


def test_a_hold_sets_one_thread_and_restores(two_threads):
    assert scipy_blas_threads() == {2}
    with blas_threads.hold() as held:
        assert held and blas_threads.holding() and scipy_blas_threads() == {1}
        with blas_threads.hold() as still:
            assert still and scipy_blas_threads() == {1}
        assert blas_threads.holding() and scipy_blas_threads() == {1}   # the outer still holds
    assert not blas_threads.holding() and scipy_blas_threads() == {2}
    with pytest.raises(RuntimeError), blas_threads.hold():
        raise RuntimeError("inside")
    assert scipy_blas_threads() == {2} and blas_threads._holds == 0


def test_a_second_threads_hold_waits_for_the_first(two_threads):
    # A holds; B asks for a hold while A sleeps in its own: B must not get in before A has
    # left, so that the thread that set the BLAS restores it. (Whether a thread other than
    # the main one can set OpenBLAS's threads depends on OpenBLAS: 0.3.30 ignored it once the
    # main thread had set them, so each hold reports whether it took, and that report is
    # what is checked for B.)
    a_in, b_asking = threading.Event(), threading.Event()
    order, took = [], []

    def first():
        with blas_threads.hold():
            a_in.set()
            b_asking.wait(timeout=30)
            time.sleep(0.2)                  # B, were it let in, would enter now
            order.append("A leaving")

    def second():
        a_in.wait(timeout=30)
        b_asking.set()
        with blas_threads.hold() as held:
            order.append("B holds")
            took.append(held == (scipy_blas_threads() == {1}))

    threads = [threading.Thread(target=f) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert order == ["A leaving", "B holds"] and took == [True]
    assert scipy_blas_threads() == {2} and blas_threads._holds == 0


def test_a_hold_that_does_not_take_says_so(monkeypatch):
    class Stubborn:                     # a BLAS that keeps its threads
        def get_num_threads(self):
            return 2

        def set_num_threads(self, n):
            pass

    monkeypatch.setattr(blas_threads, "_controllers", lambda: (Stubborn(),))
    with blas_threads.hold() as held:
        assert not held and not blas_threads.holding()


@pytest.mark.parametrize("name, large", [("Haswell", True), ("Zen", True),
                                         ("SkylakeX", False), ("SapphireRapids", False),
                                         (None, False)])
def test_large_products_only_for_the_kernels_measured_faster(name, large, monkeypatch):
    class Fake:
        internal_api = "openblas"
        architecture = name

    monkeypatch.setattr(blas_threads, "_controllers", lambda: (Fake(),))
    assert blas_threads.large_products() is large


def test_no_blas_found_keeps_the_products_small(monkeypatch):
    monkeypatch.setattr(blas_threads, "_controllers", lambda: ())
    assert blas_threads.kernel() is None and not blas_threads.large_products()
    with blas_threads.hold() as held:      # holds nothing, and says so
        assert not held


def test_the_kernel_is_scipys():
    names = {i["architecture"].lower() for i in threadpool_info()
             if i["internal_api"] == "openblas" and "scipy" in i["filepath"]
             and "numpy" not in i["filepath"]}
    if len(names) != 1:
        pytest.skip("SciPy's BLAS here is not one OpenBLAS")
    assert blas_threads.kernel() == names.pop()
