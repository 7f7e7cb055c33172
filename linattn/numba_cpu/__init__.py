"""The Numba CPU backend: compiled kernels for linear attention (Eq. 5, 9-15, 16-20) and
softmax attention (Eq. 2, 8) of Katharopoulos et al. (2020), arXiv:2006.16236.

Same functions and signatures as the NumPy forms, which are its oracle; the public functions
validate once and ``linattn.dispatch`` picks a module here.

- ``loops``     method "linear" (and "recurrent"): the running sums as compiled loops,
                ``products.causal_product`` and ``global_product``.
- ``chunked``   method "chunked": blocks of positions, each block's work in BLAS matrix
                products called from the compiled loops (Numba reaches BLAS through SciPy);
                ``block_ops``: a block's element pieces.
- ``quadratic`` method "quadratic": blocks of the kernel matrix (short sequences).
- ``padding``   key padding and states handed over, for the three linear methods.
- ``blas``      ``gemm``: a matrix product added into an array (BLAS's beta), from compiled
                code.
- ``elu``       elu+1 (Eq. 7) and its derivative with a vectorisable exp.
- ``step``      one RNN step, Eq. (16)-(20), in one call.
- ``softmax``   softmax attention in tiles (the online softmax), never the N x N matrix;
                ``flash_tiles``: its element loops.
- ``lsh``       Reformer (LSH) attention, chunk by chunk (``forms.lsh`` is its oracle;
                the public module is ``linattn.lsh``).
- ``lsh_hash``  its hashing: buckets a tile of rotations at a time, a counting sort.
- ``lsh_windows``  its walk over a round's sorted positions: windows, runs of chunks,
                the rows gathered and scattered.
- ``delta``     the delta rule's scan (``method="recurrent"`` of ``linattn.delta``).
- ``delta_chunked``  the delta rule in chunks by the WY form (``method="chunked"``), loops
                around BLAS products (``forms.delta_chunked`` is its oracle).
- ``decay_loops``  methods "linear" and "recurrent" with a decay, a log gate or without the
                normaliser: the gated running sums (``forms.decay_recurrent`` is its oracle).
- ``compile_notice``  the line on stderr while a kernel compiles for the first time (a
                cold disk cache); registered when this package is first imported.

The linear-attention kernels (``loops``, ``chunked``, ``quadratic``, ``step``; not the gated
``decay_loops`` nor the delta rule's, which take features) take ``elu=True`` to apply the
paper's feature map, elu+1 (Eq. 7), themselves, to raw q and k; the unfused path (NumPy
feature map, then the kernel) is what the tests compare to.

Policies: ``@njit(cache=True)`` everywhere, so a second process loads the compiled code
instead of compiling; no ``fastmath`` (NaN and inf propagate as in NumPy); float32 stays
float32 inside the loops; parallel over the flattened batch x heads and, when they do not
share out evenly over the threads, over blocks of the state (loops) or segments of the
sequence (chunked).

Why method "auto" is the blocks (``dispatch.AUTO_METHOD``; with a decay, a gate or no
normaliser it is ``decay_loops``, the only gated kernel here): for long sequences they beat the
plain running-sum loops at every width, causal and not, since BLAS does most of their work;
short sequences go to ``quadratic`` (blocks of the kernel matrix). The benchmark's crossover
table (``python -m linattn bench``) measures both on any machine; ``docs/performance.md`` has
the committed run.

The compiled loops' OpenMP threads spin briefly and then sleep, and OpenBLAS's threads spin a
shorter while after a product than their default, when the entry points apply the settings of
``linattn.threads`` (never at import); ``docs/performance.md`` explains them.
"""
from .compile_notice import listen as _listen

_listen()   # one line on stderr while a kernel compiles for the first time (compile_notice)
