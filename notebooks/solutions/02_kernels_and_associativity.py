"""Our answers to the exercises of notebook 02 (kernels and associativity). The checks are
in ``checks/02_kernels_and_associativity.py``; try the exercises before reading on."""
import numpy as np

import linattn


# ---- Exercise 1: hiding padded keys without the N x N matrix -------------------------------

def linear_attention_key_mask(q, k, v, key_mask, eps=1e-6):
    """Non-causal linear attention, Eq. (5), where key j takes part only if key_mask[..., j]:
    a hidden key must leave both sums, S = sum_j phi(K_j) V_j^T and z = sum_j phi(K_j), so
    zero its feature row phi(K_j) (zeroing V_j alone would leave it in the normaliser)."""
    phi = linattn.EluPlusOne()
    phi_q = phi.forward(q)
    phi_k = phi.forward(k) * key_mask[..., None]                 # (..., Nk, F), hidden rows 0
    s = np.einsum("...nf,...nm->...fm", phi_k, v)                 # S = phi(K)^T V, (..., F, M)
    z = phi_k.sum(axis=-2)                                        # (..., F)
    num = np.einsum("...nf,...fm->...nm", phi_q, s)
    den = np.einsum("...nf,...f->...n", phi_q, z)[..., None] + eps
    return num / den


# ---- Exercise 2: when does associativity pay, for cross-attention --------------------------

def matmul_multiply_adds(a_shape, b_shape):
    """Multiply-adds of (p, r) @ (r, s): p s outputs, r each."""
    (p, r), (r2, s) = a_shape, b_shape
    assert r == r2
    return p * r * s


def cheaper_from_queries(n_keys, F, M):
    """The smallest Nq >= 1 for which phi(Q) (phi(K)^T V) costs fewer multiply-adds than
    (phi(Q) phi(K)^T) V, or None. Linear: Nk F M + Nq F M; quadratic: Nq Nk F + Nq Nk M.
    Linear is cheaper iff Nq (Nk (F + M) - F M) > Nk F M: never if the bracket is <= 0."""
    gain = n_keys * (F + M) - F * M                  # what each query saves, minus its F M
    if gain <= 0:
        return None
    return n_keys * F * M // gain + 1


# ---- Exercise 3: how many pairs one round of hashing keeps ----------------------------------

def pairs_kept_one_round(n, chunk_size):
    """(i, j) pairs of lsh_attention_mask with one round, N a multiple of C: the first chunk's
    C queries see their own chunk but not themselves, C - 1 keys each; every later query sees
    its chunk and the one before, 2C - 1 keys; with C = 1 the first query sees only itself."""
    c = chunk_size
    first = c * (c - 1) if c > 1 else 1
    return first + (n - c) * (2 * c - 1)
