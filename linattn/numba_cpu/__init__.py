"""The Numba CPU backend: compiled kernels for linear attention (Eq. 5, 9-15, 16-19) and
softmax attention (Eq. 2, 8) of Katharopoulos et al. (2020), arXiv:2006.16236.

Same functions and signatures as the NumPy forms, which are its oracle; the public functions
validate once and dispatch here (``linear._kernel``, ``softmax._kernel``).

- ``loops``     method "linear" (and "recurrent"): the running sums as compiled loops,
                ``products.causal_product`` and ``global_product``.
- ``chunked``   method "chunked": blocks of positions, each block's work in BLAS matrix
                products called from the compiled loops (Numba reaches BLAS through SciPy).
- ``FORMS``     which module runs each method; "auto" is the blocks, measured faster.
- ``elu``       elu+1 (Eq. 7) and its derivative with a vectorisable exp.
- ``step``      one RNN step, Eq. (16)-(19), in one call.
- ``softmax``   softmax attention forward and backward in O(N) memory per worker.

All take ``elu=True`` to apply the paper's feature map, elu+1 (Eq. 7), themselves, to raw q
and k; the unfused path (NumPy feature map, then the kernel) is what the tests compare to.
Policies: ``@njit(cache=True)`` everywhere, so a second process loads the compiled code
instead of compiling; no ``fastmath`` (NaN and inf propagate as in NumPy); float32 stays
float32 inside the loops; parallel over the flattened batch x heads and, when they do not
share out evenly over the threads, over blocks of the state (loops) or segments of the
sequence (chunked).
"""
from . import chunked, loops

# "auto" is the blocks. Measured on a 2-core AMD EPYC (float32, N = 4096; the crossover table
# of ``python -m linattn bench`` repeats it on any machine): at 8 heads the blocks beat the
# loops at every width from D = M = 8 to 256, by 1.3-2.3x forward and 1.0-2.2x forward +
# backward; at 1 head they tie forward up to 128 and win the backward by 1.2-1.7x. Only one
# head at 256, where BLAS's single-thread limit leaves blocks of 7 positions, runs faster in
# the loops (1.1-1.4x). Non-causal, both run NumPy's two matrix products S = K^T V, out = Q S.
FORMS = {"linear": loops, "recurrent": loops, "chunked": chunked, "auto": chunked}
