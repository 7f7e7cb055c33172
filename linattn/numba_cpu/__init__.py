"""The Numba CPU backend: compiled kernels for linear attention (Eq. 5, 9-15, 16-19) and
softmax attention (Eq. 2, 8) of Katharopoulos et al. (2020), arXiv:2006.16236.

Same functions and signatures as the NumPy forms, which are its oracle; the public functions
validate once and dispatch here (``linear._kernel``, ``softmax._kernel``).

- ``loops``     method "linear" (and "recurrent"): the running sums as compiled loops,
                ``products.causal_product`` and ``global_product``.
- ``chunked``   method "chunked": the same products as blocked matrix products (BLAS).
- this module   method "auto": loops when causal, matrix products when not (``_form``).
- ``step``      one RNN step, Eq. (16)-(19), in one call.
- ``softmax``   softmax attention forward and backward in O(N) memory per worker.

All take ``elu=True`` to apply the paper's feature map, elu+1 (Eq. 7), themselves, to raw q
and k; the unfused path (NumPy feature map, then the kernel) is what the tests compare to.
Policies: ``@njit(cache=True)`` everywhere, so a second process loads the compiled code
instead of compiling; no ``fastmath`` (NaN and inf propagate as in NumPy); float32 stays
float32 inside the loops; parallel over the flattened batch x heads and, when there are
fewer of those than threads, over blocks of state columns.
"""
from . import chunked, loops

FORMS = {"linear": loops, "recurrent": loops, "chunked": chunked}


def _form(causal):
    """Loops when causal, matrix products when not, as measured on a 2-core AMD EPYC
    (float32 forward + backward, N = 2048-4096, 1 and 8 heads; the crossover table of
    ``python -m linattn.bench`` repeats the measurement on any machine).

    Causal, on one thread: the loops take half the time of the blocks at D = M = 16-64, are
    still 10-35% ahead at 128-256 and tie at 512, where the blocks' matrix products would
    start to win. On two threads the loops win at every width: NumPy runs the blocks' many
    small matrix products one after the other. Non-causal: S = K^T V and Q S are two large
    matrix products, 1.5-3x faster than the loops at every width measured (16-512).
    """
    return loops if causal else chunked


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=64, elu=False):
    """Normalised linear attention by the faster form (``_form``): (..., N, F), (..., N, M)
    -> (..., N, M)."""
    return _form(causal).attend(phi_q, phi_k, v, causal=causal, eps=eps,
                                chunk_size=chunk_size, elu=elu)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=64, elu=False):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), or (dq, dk, dv) with ``elu``."""
    return _form(causal).attend_backward(dout, phi_q, phi_k, v, causal=causal, eps=eps,
                                         chunk_size=chunk_size, elu=elu)
