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

# "auto" is the blocks. Measured on a 2-core AMD EPYC (float32, N = 4096, chunk_size 32,
# forward + backward; the crossover table of ``python -m linattn bench`` repeats it on any
# machine): at 1 head the blocks beat the loops by 1.2-2.6x at D = M = 16 to 128 and tie
# at 256; at 8 heads by 1.2x at 32, 1.9-2.3x at 64-128 and 1.2x at 256, and tie at 16
# (8.6-9.1 ms against 8.5-12.7 over two runs), where a block's products are small for BLAS.
# Non-causal, "auto" is NumPy's two matrix products S = K^T V, out = Q S (1.0-7.6x faster
# than the loops, the most at the widest heads).
FORMS = {"linear": loops, "recurrent": loops, "chunked": chunked, "auto": chunked}
