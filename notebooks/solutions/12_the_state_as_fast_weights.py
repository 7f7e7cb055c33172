"""Our answers to the exercises of notebook 12 (the state as fast weights). The checks are in
``checks/12_the_state_as_fast_weights.py``; try the exercises before reading on."""
import numpy as np


# ---- Exercise 1: a chunk's state, in log space ----------------------------------------------

def chunk_state(S, phi_k, g, v):
    """S_next = diag(exp(b_C)) S + sum_j (phi_k_j * exp(b_C - b_j)) v_j^T, with b_j the log
    gates cumulated from the chunk's start: every exponent <= 0."""
    b = np.cumsum(g, axis=0)                                  # (C, F)
    to_end = np.exp(b[-1] - b)                                # exp(b_C - b_j) <= 1, (C, F)
    return np.exp(b[-1])[:, None] * S + (phi_k * to_end).T @ v


# ---- Exercise 2: the same key twice ---------------------------------------------------------

def predict_readouts(a, b, c):
    """The sum keeps both writes under k1 (k1.k1 = 1) and none of k2's (k2.k1 = 0): a + b.
    The delta rule with beta = 1 answers b after the second write, and the write under k2
    changes S only along k2, orthogonal to k1: b."""
    return a + b, b


# ---- Exercise 3: the WY matrix --------------------------------------------------------------

def wy_T(K, beta):
    """T = (I + L)^-1 diag(beta), L = tril(diag(beta) K K^T, -1), by forward substitution:
    row t of T is beta_t e_t - sum_{s<t} L_ts T_s."""
    c = len(beta)
    L = np.tril(beta[:, None] * (K @ K.T), -1)                # (C, C), strictly lower
    T = np.zeros((c, c))
    for t in range(c):
        T[t] = -L[t, :t] @ T[:t]
        T[t, t] += beta[t]
    return T
