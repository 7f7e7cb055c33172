"""The tiled softmax forward's products alone (``lab.bench.floors``): the same tiles' two
products, S^T = K_c Q_b^T and O += S V_c, for every key block a query block sees."""
import contextlib
from unittest import mock

import numpy as np
import pytest

from linattn.lab.bench import floors


def blockwise(q, k, v, causal, block_q):
    """sum over the key blocks query block b sees of (Q_b K_c^T) V_c: causal, every key up
    to the block's last query (whole blocks, no mask within), else all of them."""
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    for i0 in range(0, q.shape[-2], block_q):
        i1 = min(q.shape[-2], i0 + block_q)
        stop = i1 if causal else k.shape[-2]
        out[..., i0:i1, :] = (q[..., i0:i1, :] @ k[..., :stop, :].swapaxes(-1, -2)
                              ) @ v[..., :stop, :]
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles, n", [((4, 3), 13), ((5, 5), 20), ((1, 7), 6), ((8, 2), 1)])
def test_the_products_are_the_forwards_tiles(causal, tiles, n):
    rng = np.random.default_rng(0)
    nk = n if causal else n + 3
    q, k = rng.standard_normal((2, 3, n, 4)), rng.standard_normal((2, 3, nk, 4))
    v = rng.standard_normal((2, 3, nk, 5))
    with mock.patch.object(floors, "planned_tiles",
                           lambda *shape: contextlib.nullcontext(tiles)):
        got = floors.softmax_products(q, k, v, causal)
    np.testing.assert_allclose(got, blockwise(q, k, v, causal, tiles[0]), rtol=1e-12,
                               atol=1e-12)
