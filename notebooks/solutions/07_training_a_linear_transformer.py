"""Our answers to notebook 07's exercises, training a linear transformer (the checks are
in ``checks/07_training_a_linear_transformer.py``).

1. ``cross_entropy_grad``: the gradient of the weighted mean cross-entropy w.r.t. the logits.
2. ``adam_step``: one bias-corrected Adam update of one array.
3. ``greedy_generate``: the model as an RNN, Eq. (16)-(20) of Katharopoulos et al. (2020),
   arXiv:2006.16236: the prompt primes each layer's state, then each argmax is fed back.
"""
import numpy as np

from linattn.model.generate import step


def cross_entropy_grad(logits, targets, weights):
    """Exercise 1: d loss / d logits for loss = sum_t w_t (-log softmax(logits_t)[y_t]) /
    sum_t w_t; logits (..., V), targets and weights (...)."""
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)                                 # softmax
    onehot = np.eye(logits.shape[-1])[targets]
    return weights[..., None] * (p - onehot) / weights.sum()


def adam_step(p, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.98, eps=1e-8):
    """Exercise 2: update number t (from 1) of parameter p with gradient g and moments m, v.
    Returns (p, m, v)."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)             # bias corrections
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def greedy_generate(params, cfg, prompt, n_new):
    """Exercise 3: prompt (B, P) -> (B, P + n_new), one ``step`` per token read."""
    tokens = np.zeros((prompt.shape[0], prompt.shape[1] + n_new), dtype=np.int64)
    tokens[:, :prompt.shape[1]] = prompt
    memories = (None,) * cfg.n_layers                 # s_0 = z_0 = 0, Eq. (16)-(17)
    for t in range(tokens.shape[1] - 1):              # the last token is never read
        logits, memories = step(params, cfg, tokens[:, t], t, memories)
        if t + 1 >= prompt.shape[1]:
            tokens[:, t + 1] = logits.argmax(axis=-1)
    return tokens
