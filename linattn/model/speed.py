"""Generation speed: the RNN form against softmax with a key/value cache and softmax
recomputing the prefix, the comparison of section 4.2 (Tables 1-2) of Katharopoulos et al.
(2020), arXiv:2006.16236, where the paper reports 317x (MNIST, N = 784) and 4462x
(CIFAR-10, N = 3072) over its softmax baseline.

Every form generates the same number of tokens from the same random model shape. A form
whose estimated time exceeds the budget is not run to the end: its time is the sum over
positions t of the cost of generating token t, measured at a few probed positions
t <= ``PROBE_LIMIT`` and interpolated between them; past the last probed position T the
cost grows as (t / T)^p with the form's exponent p in ``GROWTH`` (0 for the RNN, 1 for the
cache, 2 for recomputing). Rows say whether they were measured or estimated.
Timing only; correctness is in the tests.
"""
import timeit

import numpy as np

from .config import ModelConfig
from .generate import KVCache, generate, sample, step
from .transformer import forward, init_params

FORMS = (("linear", "recurrent"), ("softmax", "cache"), ("softmax", "recompute"))
# recomputing at t builds (B, H, t, t) attention matrices: past ~1k they take gigabytes
PROBE_LIMIT = 1024
# how the cost of one token grows with its position t: t^0, t^1, t^2
GROWTH = {"recurrent": 0, "cache": 1, "recompute": 2}


def _model(attention, n, vocab_size=18):
    cfg = ModelConfig(vocab_size=vocab_size, max_len=n, d_model=64, n_layers=2, n_heads=4,
                      d_mlp=256, attention=attention)
    return cfg, init_params(cfg, seed=0)


def _token_seconds(params, cfg, method, b, t, repeats=3):
    """Seconds to produce the token after position t (the best of ``repeats``)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (b, t + 1))
    if method == "cache":
        shape = (b, cfg.n_heads, t + 1, cfg.d_head)
        memory = tuple(KVCache(np.zeros(shape, cfg.dtype), np.zeros(shape, cfg.dtype))
                       for _ in range(cfg.n_layers))
    else:
        memory = (None,) * cfg.n_layers
    def one_token():
        if method == "recompute":
            logits = forward(params, cfg, tokens)[0][:, -1]
        else:
            logits, _ = step(params, cfg, tokens[:, t], t, memory)
        sample(logits, 1.0, rng)
    return min(timeit.repeat(one_token, number=1, repeat=repeats))


def estimate_seconds(params, cfg, method, b, n, points=6):
    """Estimated time to generate n - 1 tokens after a one-token prompt: the per-token cost
    probed at ``points`` positions up to T = min(n - 2, PROBE_LIMIT), interpolated between
    them, extrapolated as cost(T) (t / T)^GROWTH[method] past T, summed over t = 0..n-2."""
    probes = np.unique(np.linspace(0, min(n - 2, PROBE_LIMIT), points).astype(int))
    costs = [_token_seconds(params, cfg, method, b, int(t)) for t in probes]
    t = np.arange(n - 1)
    last = max(int(probes[-1]), 1)
    per_token = np.where(t <= last, np.interp(t, probes, costs),
                         costs[-1] * (t / last) ** GROWTH[method])
    return float(per_token.sum())


def generation_speed(lengths=(64, 1024, 8192), batch_size=16, budget_s=60.0):
    """Sequences per second of each form in ``FORMS`` at each length N.

    Parameters
    ----------
    lengths : sequence of int
        Sequence lengths N; each form generates N - 1 tokens after one prompt token.
    batch_size : int
        Sequences generated together.
    budget_s : float
        A form whose estimate exceeds this is estimated, not run.

    Returns
    -------
    rows : list of dict
        ``N, attention, method, seconds, sequences_per_s, measured``, and
        ``speedup_vs_recompute``, ``speedup_vs_cache`` of the recurrent form.
    """
    rows = []
    for n in lengths:
        by_method = {}
        for attention, method in FORMS:
            cfg, params = _model(attention, n)
            seconds = estimate_seconds(params, cfg, method, batch_size, n)
            measured = seconds <= budget_s
            if measured:
                prompt = np.zeros((batch_size, 1), dtype=np.int64)
                seconds = timeit.timeit(lambda: generate(params, cfg, prompt, n - 1,
                                                         method=method, temperature=1.0),
                                        number=1)
            by_method[method] = seconds
            rows.append(dict(N=n, attention=attention, method=method, batch=batch_size,
                             seconds=seconds, sequences_per_s=batch_size / seconds,
                             measured=measured))
        rnn = rows[-len(FORMS)]
        rnn["speedup_vs_recompute"] = by_method["recompute"] / by_method["recurrent"]
        rnn["speedup_vs_cache"] = by_method["cache"] / by_method["recurrent"]
    return rows
