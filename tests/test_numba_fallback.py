"""Numba's private API (``linattn.numba_cpu._internals``: an LLVM intrinsic and Numba's BLAS
entry) may move between releases. Without it the backend must still import and give the
same results, through plain compiled loops: run it that way in a fresh process, with its own
Numba cache so that no kernel compiled against the intrinsics is loaded."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["linattn.numba_cpu._internals"] = None       # as if Numba had moved it
    import numpy as np
    import linattn
    from linattn.numba_cpu import blas, elu
    assert not blas.NATIVE and not elu.NATIVE
    rng = np.random.default_rng(0)
    for dtype, rtol in ((np.float64, 1e-10), (np.float32, 2e-4)):
        q, k, v, dout = rng.standard_normal((4, 2, 45, 6)).astype(dtype)
        for causal in (True, False):
            for method in ("chunked", "linear"):
                kw = dict(causal=causal, method=method, chunk_size=8)
                want = linattn.linear_attention(q, k, v, backend="numpy", **kw)
                got = linattn.linear_attention(q, k, v, backend="numba", **kw)
                np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
                wants = linattn.linear_attention_backward(dout, q, k, v, backend="numpy", **kw)
                gots = linattn.linear_attention_backward(dout, q, k, v, backend="numba", **kw)
                for g, w in zip(gots, wants):
                    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
            lsh = dict(n_hashes=2, chunk_size=8, causal=causal)
            np.testing.assert_allclose(linattn.lsh_attention(q, v, backend="numba", **lsh),
                                       linattn.lsh_attention(q, v, backend="numpy", **lsh),
                                       rtol=rtol, atol=rtol)
            for g, w in zip(linattn.lsh_attention_backward(dout, q, v, backend="numba", **lsh),
                            linattn.lsh_attention_backward(dout, q, v, backend="numpy", **lsh)):
                np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
            want = linattn.softmax_attention(q, k, v, causal=causal, backend="numpy")
            got = linattn.softmax_attention(q, k, v, causal=causal, backend="numba")
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
        out, _ = linattn.linear_attention_step(q[:, 0], k[:, 0], v[:, 0], backend="numba")
        want, _ = linattn.linear_attention_step(q[:, 0], k[:, 0], v[:, 0], backend="numpy")
        np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol)
    print("fallback ok")
""")


@pytest.mark.slow
def test_backend_works_without_numbas_private_api(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "fallback ok" in result.stdout
