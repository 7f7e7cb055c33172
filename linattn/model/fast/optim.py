"""Adam for the compiled path: ``optim.adam_update`` with each parameter's update as one
compiled pass, without NumPy's temporaries of every array.

The same function as the reference (Kingma and Ba, 2015; the optimiser of the experiments of
Katharopoulos et al. (2020), arXiv:2006.16236, section 4), the same operations in the same
order, so the same numbers: with clipping, the global norm is summed in another order and
may differ in its last bit (tests/test_model_optim.py). The updates run on the calling
thread, in order; why not in parallel: docs/performance.md.
Reference: ``linattn.model.optim.adam_update``.
"""
import numpy as np
from numba import njit

from ..optim import AdamState, check_gradients, global_norm, learning_rate, max_norm_scale


def adam_update(params, grads, state, cfg):
    """One Adam step with clipping and warm-up, as ``optim.adam_update``: same arguments
    (params, grads, state, cfg) and results (params, state, norm); each parameter's update
    in one compiled pass (``adam_step``). Cost: O(number of parameters)."""
    check_gradients(params, grads)
    norm = global_norm(grads, sum_squares)
    scale = max_norm_scale(norm, cfg.clip)                  # clipping, folded into the step
    lr = learning_rate(cfg, state.step)
    t = state.step + 1
    c1, c2 = 1 - cfg.beta1**t, 1 - cfg.beta2**t              # bias corrections
    new_params, m, v = {}, {}, {}
    for name, p in params.items():
        new_params[name], m[name], v[name] = adam_step(
            p, grads[name], state.m[name], state.v[name], scale, lr, cfg.beta1, cfg.beta2,
            c1, c2, cfg.eps)
    return new_params, AdamState(t, m, v), norm


@njit(cache=True, error_model="numpy")
def _sum_squares(x):
    """Four interleaved float64 sums: one chain of adds would wait on each add's latency."""
    s0 = s1 = s2 = s3 = 0.0
    n4 = x.size - x.size % 4
    for i in range(0, n4, 4):
        s0 += np.float64(x[i]) * np.float64(x[i])
        s1 += np.float64(x[i + 1]) * np.float64(x[i + 1])
        s2 += np.float64(x[i + 2]) * np.float64(x[i + 2])
        s3 += np.float64(x[i + 3]) * np.float64(x[i + 3])
    for i in range(n4, x.size):
        s0 += np.float64(x[i]) * np.float64(x[i])
    return (s0 + s1) + (s2 + s3)


def sum_squares(x):
    """sum of x^2 over every element, accumulated in float64: a term of
    ``optim.global_norm``. Cost: O(size(x))."""
    return _sum_squares(x.reshape(-1))


@njit(cache=True, error_model="numpy")
def _adam(p, g, m, v, scale, lr, b1, one_b1, b2, one_b2, c1, c2, eps, p_new, m_new, v_new):
    """The operations of ``optim.adam_update`` in its order, element by element."""
    for i in range(p.size):
        gi = g[i] * scale                                   # clipped
        mi = b1 * m[i] + one_b1 * gi                        # first moment
        vi = b2 * v[i] + one_b2 * gi * gi                   # second moment
        m_new[i], v_new[i] = mi, vi
        p_new[i] = p[i] - lr * (mi / c1) / (np.sqrt(vi / c2) + eps)


def adam_step(p, g, m, v, scale, lr, beta1, beta2, c1, c2, eps):
    """One parameter's Adam update with its gradient scaled by ``scale`` (clipping):
    returns new (p, m, v), the same numbers as ``optim.adam_update`` computes, in one pass.
    Cost: O(size(p))."""
    t = p.dtype.type
    p_new, m_new, v_new = np.empty_like(p), np.empty_like(m), np.empty_like(v)
    _adam(p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), t(scale), t(lr),
          t(beta1), t(1 - beta1), t(beta2), t(1 - beta2), t(c1), t(c2), t(eps),
          p_new.reshape(-1), m_new.reshape(-1), v_new.reshape(-1))
    return p_new, m_new, v_new
