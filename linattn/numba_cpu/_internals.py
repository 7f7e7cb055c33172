"""Every use of Numba's private API in linattn, in one module: two intrinsics that emit LLVM IR.

- ``xxgemm``: BLAS ?gemm called from compiled code with a beta Numba's ``np.dot`` never
  exposes, through the entry point Numba's own ``np.dot`` uses (``numba_xxgemm``, SciPy's
  BLAS), for ``blas.gemm``.
- ``with_bits``: a float from its bit pattern, for the vectorisable exp of ``elu``.
- ``fmuladd``: a b + c in one instruction where the CPU has FMA, for ``flash_tiles``'s exp.

They rely on ``numba.core.cgutils`` and ``numba.np.linalg``, which are not public and may move
between Numba releases (``pyproject.toml`` pins the range CI tests). If this module fails to
import, ``blas``, ``elu`` and ``flash_tiles`` fall back to plain compiled loops and
``math.exp``: the same results, slower; ``tests/test_numba_fallback.py`` runs the backend
that way.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.linalg import check_blas_return, ensure_blas, get_blas_kind


@intrinsic
def xxgemm(typingctx, a, b, out, beta):
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


@intrinsic
def with_bits(typingctx, bits, like):
    """The float of ``like``'s type whose bit pattern is the integer ``bits`` (cut or
    sign-extended to that width): 2^n from its exponent field, without a table lookup."""
    if not (isinstance(bits, types.Integer) and isinstance(like, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        width = ir.IntType(like.bitwidth)
        raw = args[0]
        if bits.bitwidth > like.bitwidth:
            raw = builder.trunc(raw, width)
        elif bits.bitwidth < like.bitwidth:
            raw = builder.sext(raw, width)
        return builder.bitcast(raw, context.get_value_type(like))

    return like(bits, like), codegen


@intrinsic
def fmuladd(typingctx, a, b, c):
    """a b + c, rounded once where the CPU has FMA (``llvm.fmuladd``), else twice."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(a)
        name = f"llvm.fmuladd.f{a.bitwidth}"
        fn = cgutils.get_or_insert_function(builder.module,
                                            ir.FunctionType(ty, [ty, ty, ty]), name)
        return builder.call(fn, args)

    return a(a, b, c), codegen
