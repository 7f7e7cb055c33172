"""The LSH head to head (``linattn.lab.bench.lsh_peer``): linattn's side and the scaling fit run
at tiny sizes; pft's side only where pytorch-fast-transformers is installed."""
import pytest

from linattn.lab.bench import lsh_peer

CONFIG = dict(n=64, heads=2, dim=4, chunk_size=8, bits=4, n_buckets=None, rounds=2,
              threads=1, repeats=1)


def test_linattn_side_and_scaling():
    seconds = lsh_peer.ours_seconds(CONFIG, 64)
    assert set(seconds) == {"forward_s", "backward_s", "forward_backward_s"}
    assert all(s > 0 for s in seconds.values())
    rows, (time_slope, memory_slope) = lsh_peer.scaling(CONFIG, [64, 128, 256])
    assert [n for n, _, _ in rows] == [64, 128, 256]
    assert 0.5 < memory_slope < 1.5                 # the arrays double with N


def test_pft_side():
    pytest.importorskip("fast_transformers")
    seconds = lsh_peer.pft_seconds(CONFIG)
    assert set(seconds) == {"forward_s", "forward_backward_s"}
