"""The Numba CPU backend: compiled kernels for linear attention (Eq. 5, 9-15, 16-20) and
softmax attention (Eq. 2, 8) of Katharopoulos et al. (2020), arXiv:2006.16236.

Same functions and signatures as the NumPy forms, which are its oracle; the public functions
validate once and ``linattn.dispatch`` picks a module here.

- ``loops``     method "linear" (and "recurrent"): the running sums as compiled loops,
                ``products.causal_product`` and ``global_product``.
- ``chunked``   method "chunked": blocks of positions, each block's work in BLAS matrix
                products called from the compiled loops (Numba reaches BLAS through SciPy).
- ``blas``      ``gemm``: a matrix product added into an array (BLAS's beta), from compiled
                code.
- ``elu``       elu+1 (Eq. 7) and its derivative with a vectorisable exp.
- ``step``      one RNN step, Eq. (16)-(20), in one call.
- ``softmax``   softmax attention in tiles (the online softmax), never the N x N matrix;
                ``flash_tiles``: its element loops.
- ``lsh``       Reformer (LSH) attention, chunk by chunk (``forms.lsh`` is its oracle;
                the public module is ``linattn.lsh``).
- ``lsh_hash``  its hashing: buckets a tile of rotations at a time, a counting sort.
- ``decode``    the element work of a generated token for ``model.decode``: residual add
                and layer norm, GELU, one query against the key/value cache.

All take ``elu=True`` to apply the paper's feature map, elu+1 (Eq. 7), themselves, to raw q
and k; the unfused path (NumPy feature map, then the kernel) is what the tests compare to.
- ``compile_notice``  the line on stderr while a kernel compiles for the first time (a
                cold disk cache); registered when this package is first imported.

Policies: ``@njit(cache=True)`` everywhere, so a second process loads the compiled code
instead of compiling; no ``fastmath`` (NaN and inf propagate as in NumPy); float32 stays
float32 inside the loops; parallel over the flattened batch x heads and, when they do not
share out evenly over the threads, over blocks of the state (loops) or segments of the
sequence (chunked).

Why method "auto" is the blocks (``dispatch.AUTO_METHOD``), measured on a 2-core AMD EPYC
(float32, N = 4096, default chunk size, forward + backward; the crossover table of ``python -m linattn bench`` repeats it on
any machine): the blocks beat the loops at every width tried, at 8 heads by 1.4x at
D = M = 16, 2.1-2.4x at 32 to 128 and 1.6x at 256, at 1 head by 1.3x at 16, 2.2x at 64
and 1.6x at 256.
Non-causal, the same blocks with the whole row's state: 2.0-4.2x faster than the loops at
1 and 8 heads, D = M = 16 to 256 (and 1.3-1.7x faster than causal up to D = M = 64 at 8
heads; as fast beyond, where the state's products are all the work). NumPy's two products
S = K^T [V, 1], out = Q S, which they replace, ran 2.5-3.7x slower at D = M = 64.
Short sequences go to ``quadratic`` instead (blocks of the kernel matrix; the rule and its
measurement are in ``dispatch.AUTO_METHOD``).

The compiled loops' OpenMP threads spin briefly (about 0.1 ms) and then sleep, and OpenBLAS's
threads spin a shorter while after a product than their default: set at import by
``linattn.threads``, which has the measurements.
"""
from .compile_notice import listen as _listen

_listen()   # one line on stderr while a kernel compiles for the first time (compile_notice)
