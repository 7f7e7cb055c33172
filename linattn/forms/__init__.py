"""The NumPy forms of linear attention, one module per ``method``.

Each module computes the same function of positive features and values,
out_i = phi_q_i^T S / (phi_q_i^T z + eps), and its backward, with one pair of functions:

- ``attend(phi_q, phi_k, v, *, causal, eps, chunk_size) -> out``
- ``attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size) -> (dphi_q, dphi_k, dv)``

Shapes: phi_q, phi_k (..., N, F); v, out, dout (..., N, M). ``quadratic`` is the oracle.

``lsh`` is apart: Reformer (LSH) attention, ``attend(qk, v, ...)`` and
``attend_backward(dout, qk, v, ...) -> (dqk, dv)`` with shared queries and keys, the
reference of ``numba_cpu.lsh``; its oracle is softmax restricted to its ``mask``.
"""
