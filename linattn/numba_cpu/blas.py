"""One BLAS matrix product that adds into its output, callable from compiled code:
``gemm(a, b, out, beta)`` sets out = a b + beta out.

Numba's ``np.dot(a, b, out)`` always overwrites ``out``; the blocked kernels (``chunked``)
mostly want to add a product to something they hold: the state, S += phi_k^T v (Eq. 10), or
a block's output, out = phi_q S, then out += tril(phi_q phi_k^T) v (Eq. 9). With a product
into a temporary and a separate add, each block reads and writes a (D, M) or (C, M) array
once more and allocates it; at C = 16, D = M = 64 that was 20% of the backward's time.
BLAS gemm computes alpha a b + beta c in one call, so ``gemm`` hands beta through, using
the same entry point as Numba's own ``np.dot`` (``numba_xxgemm``, SciPy's BLAS).
Oracle: NumPy's a @ b + beta * out (``test_numba_cpu``).
"""
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.linalg import check_blas_return, ensure_blas, get_blas_kind


@intrinsic
def _xxgemm(typingctx, a, b, out, beta):
    """BLAS ?gemm for a (m, k) @ b (k, n) into out (m, n), C- or F-ordered a and b, C-ordered
    out, all of one float dtype, every dimension > 0."""
    arrays = (a, b, out)
    if not (all(isinstance(x, types.Array) and x.ndim == 2 and x.dtype == out.dtype
                for x in arrays) and out.dtype in (types.float32, types.float64)
            and out.layout == "C" and a.layout in "CF" and b.layout in "CF"
            and isinstance(beta, (types.Float, types.Integer))):
        return None
    ensure_blas()

    def codegen(context, builder, signature, args):
        char, void_p = ir.IntType(8), ir.IntType(8).as_pointer()
        intp = context.get_value_type(types.intp)
        fnty = ir.FunctionType(ir.IntType(32), [char, char, char, intp, intp, intp, void_p,
                                                void_p, intp, void_p, intp, void_p, void_p,
                                                intp])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xxgemm")
        dtype = out.dtype

        def operand(ty, value):
            """(transpose flag, leading dimension, data) of one array for column-major BLAS:
            a C-ordered (r, c) array is a column-major (c, r) one."""
            array = context.make_array(ty)(context, builder, value)
            rows, cols = cgutils.unpack_tuple(builder, array.shape, 2)
            flag = ir.Constant(char, ord("n" if ty.layout == "C" else "t"))
            return flag, cols if ty.layout == "C" else rows, builder.bitcast(array.data, void_p)

        def slot(value):
            return builder.bitcast(cgutils.alloca_once_value(builder, value), void_p)

        # row-major out = a b is column-major out^T = b^T a^T: BLAS gets b first
        trans_b, ld_b, data_b = operand(b, args[1])
        trans_a, ld_a, data_a = operand(a, args[0])
        _, ld_out, data_out = operand(out, args[2])
        m, k = cgutils.unpack_tuple(builder, context.make_array(a)(context, builder,
                                                                   args[0]).shape, 2)
        n = cgutils.unpack_tuple(builder, context.make_array(b)(context, builder,
                                                                args[1]).shape, 2)[1]
        alpha = slot(context.get_constant(dtype, 1.0))
        beta_value = slot(context.cast(builder, args[3], signature.args[3], dtype))
        kind = ir.Constant(char, ord(get_blas_kind(dtype)))
        status = builder.call(fn, (kind, trans_b, trans_a, n, m, k, alpha, data_b, ld_b,
                                   data_a, ld_a, beta_value, data_out, ld_out))
        check_blas_return(context, builder, status)
        return context.get_dummy_value()

    return types.void(a, b, out, beta), codegen


@njit(cache=True, error_model="numpy")
def gemm(a, b, out, beta):
    """out = a @ b + beta * out, in place, for 2-D float arrays: a (m, k) and b (k, n) C- or
    F-ordered (a transposed C array is F-ordered: no copy), out (m, n) C-ordered.
    beta = 0 ignores out's old values (NaN there included), as BLAS does; k = 0 gives
    beta * out, and an empty out is left alone (BLAS rejects zero leading dimensions)."""
    if a.shape[0] != out.shape[0] or b.shape[1] != out.shape[1] or a.shape[1] != b.shape[0]:
        raise ValueError("gemm: shapes do not match")
    if out.size == 0:
        return
    if a.shape[1] == 0:
        if beta == 0:
            out[:] = 0
        else:
            out *= beta
        return
    _xxgemm(a, b, out, beta)
