"""Autoregressive generation three ways, section 3.4 and 4.2 of Katharopoulos et al. (2020),
arXiv:2006.16236.

- ``"recurrent"`` (linear models): the transformer as an RNN. Each layer and head carries
  its state (S, z) of the RNN, Eq. (16)-(20); a new token costs one RNN step per layer,
  O(d_model^2 + d_model d_head) time and constant memory, whatever its position. The
  variants beyond the paper ("decay", "gated", "delta", ``model.variants``) are RNNs too:
  the decayed or gated state (S, z), or the delta rule's memory S; they generate on the
  reference path (``model.paths``).
- ``"cache"`` (softmax models): keys and values of earlier positions are kept, and the new
  query attends to them: O(t d_model) time and memory at position t.
- ``"recompute"`` (any attention): the whole prefix goes through ``transformer.forward``
  again for every token, O(t^2 d_model) at position t for softmax. This is the reference:
  the fast forms must pick token for token what it picks. It is the only form for LSH
  (Reformer) models, which have no constant-size state and no valid cache: every new token
  is hashed and sorted with the others, which moves the chunk boundaries, so the outputs of
  earlier positions (and the next layer's keys built from them) can change. Recomputing the
  prefix is the one exact way; it costs O(t (d_model^2 + n_hashes C d_model)) plus the
  hashing at position t.

"recurrent" and "cache" read the prompt, all but its last token, at once: one parallel
causal call per layer (``prefill.read_prompt``: linear attention returning the RNN's state,
softmax giving the keys and values that fill the cache), then go on a token at a time from
that state or cache.
The first two run on the path ``path`` names (``model.paths``): "lean", the default, the
compiled token loop of ``model.fast.token_loop`` (weights prepared once, buffers reused,
compiled element work; with elu+1 features a whole token in one compiled call,
``model.fast.rnn_token``); "reference", ``step`` of
``model.token_step`` a token at a time, the NumPy layers and the library's public
attention. tests/test_model_generate.py holds the two together: logits within rounding in
float64 and the same tokens, greedy or sampled.
"""
import numpy as np

from . import paths
from .config import VARIANTS
from .token_step import KVCache, step  # noqa: F401  (the reference step, read there)
from .transformer import forward

METHODS = ("auto", "recurrent", "cache", "recompute")


def sample(logits, temperature, rng):
    """One token per row: the argmax if ``temperature`` is 0, else a draw from
    softmax(logits / temperature) (computed in float64). logits (B, V) -> (B,) ints."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    cdf = np.cumsum(p, axis=-1)
    u = rng.random((logits.shape[0], 1)) * cdf[:, -1:]            # inverse-CDF sampling
    return np.minimum((cdf < u).sum(axis=-1), logits.shape[-1] - 1)


def _resolve(method, cfg):
    if not cfg.causal:
        raise ValueError("generation needs a causal model; this one (causal=False) is an "
                         "encoder whose every position reads the whole sequence")
    if method not in METHODS:
        raise ValueError(f"unknown generation method {method!r}; valid: {', '.join(METHODS)}")
    if method == "auto":
        return {"softmax": "cache", "lsh": "recompute"}.get(cfg.attention, "recurrent")
    fits = {"recurrent": ("linear", *VARIANTS), "cache": ("softmax",)}.get(
        method, (cfg.attention,))
    if cfg.attention not in fits:
        raise ValueError(f"method {method!r} does not apply to {cfg.attention} attention: "
                         f"use 'recurrent' for {', '.join(('linear', *VARIANTS))}, 'cache' "
                         "for softmax, or 'recompute' (the only form for lsh)")
    return method


def generate(params, cfg, prompt, n_new, *, method="auto", temperature=0.0, seed=0,
             path="lean"):
    """Continue ``prompt`` by ``n_new`` tokens.

    Parameters
    ----------
    params : dict, cfg : ModelConfig
    prompt : ndarray of int, shape (B, P), P >= 1
    n_new : int
    method : {"auto", "recurrent", "cache", "recompute"}
        "auto" is "recurrent" for linear attention and the variants beyond the paper,
        "cache" for softmax and "recompute" for lsh.
    temperature : float
        0 decodes greedily; otherwise tokens are sampled from softmax(logits / temperature).
    seed : int
        Seed of the sampling.
    path : {"lean", "reference"}
        Which path computes the "recurrent" and "cache" methods (``model.paths``): the
        compiled token loop, or ``step`` with the NumPy layers; the same tokens.

    Returns
    -------
    tokens : ndarray of int, shape (B, P + n_new), the prompt followed by the new tokens.

    Cost per new token at position t: O(d_model^2) plus O(d_model d_head) (recurrent),
    O(t d_model) (cache) or O(t d_model^2 + t^2 d_model) (recompute, softmax); "recurrent"
    and "cache" read the prompt first by one parallel forward over its P - 1 first positions.
    """
    method = _resolve(method, cfg)
    next_logits = paths.resolve(path, cfg).next_logits
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[1] < 1 or prompt.dtype.kind not in "iu":
        raise ValueError(f"prompt must be integer ids of shape (B, P >= 1), got "
                         f"{prompt.dtype} {prompt.shape}")
    if not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    b, n_prompt = prompt.shape
    total = n_prompt + n_new
    if n_new < 0 or max(n_prompt, total - 1) > cfg.max_len:
        # the model reads every token but the last one generated
        raise ValueError(f"prompt length {n_prompt} + n_new {n_new} - 1 must be at most "
                         f"max_len {cfg.max_len} (and n_new >= 0)")
    if prompt.min() < 0 or prompt.max() >= cfg.vocab_size:
        raise ValueError(f"prompt ids must lie in [0, {cfg.vocab_size}), got "
                         f"[{prompt.min()}, {prompt.max()}]")
    rng = np.random.default_rng(seed)
    tokens = np.zeros((b, total), dtype=np.int64)
    tokens[:, :n_prompt] = prompt
    if method == "recompute":
        for t in range(n_prompt, total):
            logits, _ = forward(params, cfg, tokens[:, :t])
            tokens[:, t] = sample(logits[:, -1], temperature, rng)
        return tokens
    # the model reads positions 0..total-2: the prompt but its last token at once (the
    # memories), then a token at a time from position n_prompt - 1, each token sampled at
    # t + 1 written before the path reads it
    logits_from = next_logits(params, cfg, tokens, n_prompt)
    for t, logits in zip(range(n_prompt - 1, total - 1), logits_from):
        tokens[:, t + 1] = sample(logits, temperature, rng)
    return tokens
