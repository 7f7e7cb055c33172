"""What the benchmark measures with linattn itself: time and memory against N for each form of
attention, the loops-versus-blocks crossover, and the cost of generating one token.

Every case is a pair of closures over float arrays of shape (batch, heads, N, D): the forward
(q, k, v), and the forward and backward as a training step runs them (q, k, v, dout). A case
stops growing N once one forward + backward takes longer than the time budget (with
``--tokens``, the budget of that many tokens' work: ``timing.over_budget``), and softmax
on NumPy once its N x N matrices would not fit in memory. With ``--tokens T`` the batch
shrinks as N grows, batch = max(1, T // N), as in the paper's Figure 1, so that time and
memory per sample can be compared across N at a constant load (up to N = T; batch 1 beyond).
"""
import functools
import time

import numpy as np

from ... import (Recurrence, delta_rule_attention, delta_rule_attention_backward,
                linear_attention, linear_attention_backward, linear_attention_step,
                lsh_attention, lsh_attention_backward, softmax_attention,
                softmax_attention_backward)
from . import timing


def _pair(forward, backward):
    """(forward, forward then backward) of a form whose backward takes q, k, v and dout."""
    return forward, lambda q, k, v, dout: (forward(q, k, v), backward(q, k, v, dout))


def _linear(causal, method, backend):
    kw = dict(causal=causal, method=method, backend=backend)
    return _pair(lambda q, k, v: linear_attention(q, k, v, **kw),
                 lambda q, k, v, dout: linear_attention_backward(dout, q, k, v, **kw))


def _softmax(backend, causal=True):
    """Softmax attention; the backward takes the forward's output and log-sum-exp, as
    PyTorch's flash-attention kernel keeps them for its backward."""
    kw = dict(causal=causal, backend=backend)

    def forward_backward(q, k, v, dout):
        out, lse = softmax_attention(q, k, v, return_lse=True, **kw)
        return out, softmax_attention_backward(dout, q, k, v, out=out, lse=lse, **kw)
    return lambda q, k, v: softmax_attention(q, k, v, **kw), forward_backward


def _lsh(rounds):
    """Reformer attention of ``rounds`` hash rounds, chunks of 32 (the paper's lsh-1/4/8),
    not causal, with q as the shared queries-and-keys (k is not used)."""
    kw = dict(n_hashes=rounds, chunk_size=32, backend="numba")
    return _pair(lambda q, k, v: lsh_attention(q, v, **kw),
                 lambda q, k, v, dout: lsh_attention_backward(dout, q, v, **kw))


def _decay(method, backend):
    """Causal linear attention whose state decays by 0.99 a position (RetNet's scalar decay)."""
    kw = dict(causal=True, method=method, backend=backend, decay=0.99)
    return _pair(lambda q, k, v: linear_attention(q, k, v, **kw),
                 lambda q, k, v, dout: linear_attention_backward(dout, q, k, v, **kw))


def _delta(method, backend):
    """The delta rule with every write strength 1/2."""
    kw = dict(method=method, backend=backend)

    def beta(v):
        return np.full(v.shape[:-1], 0.5, v.dtype)
    return _pair(lambda q, k, v: delta_rule_attention(q, k, v, beta(v), **kw),
                 lambda q, k, v, dout: delta_rule_attention_backward(dout, q, k, v, beta(v),
                                                                     **kw))


# name -> (forward, forward + backward); softmax is causal, like the linear forms named so
CASES = {
    "softmax numpy": _softmax("numpy"),
    "softmax numba": _softmax("numba"),
    "softmax numba non-causal": _softmax("numba", causal=False),
    "non-causal numba": _linear(False, "auto", "numba"),  # the default: matrix products
    "non-causal numba loops": _linear(False, "linear", "numba"),
    "causal numpy linear": _linear(True, "linear", "numpy"),
    "causal numpy chunked": _linear(True, "chunked", "numpy"),
    "causal numba loops": _linear(True, "linear", "numba"),
    "causal numba chunked": _linear(True, "chunked", "numba"),
    "causal numba": _linear(True, "auto", "numba"),       # the default: the blocks
    "lsh-1 numba": _lsh(1),
    "lsh-4 numba": _lsh(4),
    "lsh-8 numba": _lsh(8),
    "decay numba loops": _decay("recurrent", "numba"),
    "decay numpy chunked": _decay("chunked", "numpy"),
    "delta numba chunked": _delta("chunked", "numba"),
    "delta numba recurrent": _delta("recurrent", "numba"),
    "delta numpy chunked": _delta("chunked", "numpy"),
}
# the forms between which method "auto" chooses for a decay and for the delta rule
AUTO_RULES = ("decay numba loops", "decay numpy chunked", "delta numba chunked",
              "delta numba recurrent", "delta numpy chunked")
SCALING = tuple(name for name in CASES
                if name not in ("non-causal numba loops", "softmax numba non-causal",
                                *AUTO_RULES))
# the head-to-head: each of our cases against the peer a user would pick instead (peers.py)
PAIRS = (("causal numba", "pft causal linear"), ("softmax numba", "torch softmax"),
         ("softmax numba non-causal", "torch softmax non-causal"),
         ("lsh-1 numba", "pft reformer-1"), ("lsh-4 numba", "pft reformer-4"))
# the pairs the head to head times whatever ``--cases`` says: the headline, and the
# non-causal softmax, which the scaling leaves out
ALWAYS_HEAD_TO_HEAD = ("causal numba", "softmax numba non-causal")
# the softmax cases whose products alone the head to head times (``floors``): name -> causal
SOFTMAX_FLOORS = {"softmax numba": True, "softmax numba non-causal": False}
CROSSOVER = ("causal numba loops", "causal numba chunked", "non-causal numba loops",
             "non-causal numba")


def batch_at(cfg, n):
    """The batch at length ``n``: ``cfg.batch``, or max(1, T // n) with ``--tokens T``."""
    return cfg.batch if cfg.tokens is None else max(1, cfg.tokens // n)


def inputs(batch, heads, n, d, m, dtype, seed=0):
    """q, k (batch, heads, n, d), v and dout (batch, heads, n, m): standard normal."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((batch, heads, n, d), dtype=np.float32) for _ in range(2))
    v, dout = (rng.standard_normal((batch, heads, n, m), dtype=np.float32) for _ in range(2))
    return tuple(x.astype(dtype, copy=False) for x in (q, k, v, dout))


def _softmax_fits(batch, heads, n, itemsize):
    """Whether NumPy softmax's backward (about six N x N arrays per head) fits in half the
    memory available now."""
    need = 6 * batch * heads * n * n * itemsize
    return need < 0.5 * _available_bytes()


def _available_bytes():
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def measure(name, q, k, v, dout, repeats, pause, memory=True, warm=False):
    """One point: forward and forward + backward seconds (``timing.point``; ``warm``: the
    case ran before in this process), and the peak extra bytes of a forward + backward,
    after a ``pause`` of seconds (``timing.settle``)."""
    forward, forward_backward = CASES[name]

    def both():
        return forward_backward(q, k, v, dout)

    timing.settle(pause)
    row = {"case": name, "n": q.shape[-2]}
    (row["forward_s"], row["forward_best_s"], row["forward_backward_s"],
     row["forward_backward_best_s"]) = timing.point(lambda: forward(q, k, v), both, repeats,
                                                    warm)
    row["peak_extra_bytes"] = timing.peak_bytes(both) if memory else None
    return row


def scaling(cfg, progress):
    """Rows of ``measure`` for every case and N = 2^lo .. 2^hi, each case until it exceeds
    ``cfg.budget`` seconds for one forward + backward (with ``--tokens``, for that many
    tokens' work: ``timing.over_budget``)."""
    rows, stopped = [], set()
    for n in cfg.ns:
        batch = batch_at(cfg, n)
        q, k, v, dout = inputs(batch, cfg.heads, n, cfg.dim, cfg.value_dim, cfg.dtype)
        for name in cfg.cases:
            advance(progress, f"{name} N={n}")
            if name in stopped:
                continue
            if name == "softmax numpy" and not _softmax_fits(batch, cfg.heads, n,
                                                             q.itemsize):
                stopped.add(name)
                continue
            warm = any(row["case"] == name for row in rows)
            row = measure(name, q, k, v, dout, cfg.repeats, cfg.pause, warm=warm)
            row["batch"] = batch
            rows.append(row)
            if timing.over_budget(row["forward_backward_s"], cfg.budget, batch, n, cfg.tokens):
                stopped.add(name)
    return rows


def crossover(cfg, progress, widths=(16, 32, 64, 128, 256)):
    """Forward + backward of the Numba loops and matrix products, causal and not, at D = M = w
    and N = ``cfg.cross_n``, for 1 and ``cfg.heads`` heads: where matrix products win."""
    rows = []
    for heads in sorted({1, cfg.heads}):
        for w in widths:
            q, k, v, dout = inputs(cfg.batch, heads, cfg.cross_n, w, w, cfg.dtype)
            for name in CROSSOVER:
                advance(progress, f"crossover {name} h={heads} D=M={w}")
                row = measure(name, q, k, v, dout, cfg.repeats, cfg.pause, memory=False)
                rows.append({**row, "heads": heads, "width": w})
    return rows


def auto_rules(cfg, progress, ns=(64, None)):
    """Forward + backward of each of ``AUTO_RULES`` at ``cfg.heads`` heads, D = ``cfg.dim``,
    M = ``cfg.value_dim``, batch 1, for N in ``ns`` (None: ``cfg.cross_n``): the timings
    behind ``dispatch``'s rules for a decay (``GATED``) and for the delta rule."""
    rows = []
    for n in (cfg.cross_n if n is None else n for n in ns):
        q, k, v, dout = inputs(1, cfg.heads, n, cfg.dim, cfg.value_dim, cfg.dtype)
        for name in AUTO_RULES:
            advance(progress, f"auto rules {name} N={n}")
            rows.append({**measure(name, q, k, v, dout, cfg.repeats, cfg.pause, memory=False),
                         "heads": cfg.heads, "width": cfg.dim})
    return rows


def tokens(q, k, v):
    """(1, heads, n, .) inputs as n tokens (n, 1, heads, .): one contiguous (1, heads, .)
    array a token, as a model's projections make them (and as the peer's step is timed),
    not rows strided across the whole sequence."""
    return tuple(np.ascontiguousarray(np.moveaxis(x, 2, 0)) for x in (q, k, v))


def step_seconds(q_t, k_t, v_t):
    """Seconds of each ``linear_attention_step`` scanning the tokens from the zero state."""
    per_token, state = np.empty(len(q_t)), None
    for t in range(len(q_t)):
        token = q_t[t], k_t[t], v_t[t]                  # indexing is not the step's work
        start = time.perf_counter()
        _, state = linear_attention_step(*token, state)
        per_token[t] = time.perf_counter() - start
    return per_token


def recurrence_seconds(q_t, k_t, v_t):
    """Seconds of each ``Recurrence.step`` scanning the tokens from the zero state: the
    state kept in place, checked once (the first call, which may load the compiled kernel,
    is left out of the timing by a reset)."""
    rnn = Recurrence(q_t.shape[1:-1], q_t.shape[-1], v_t.shape[-1], dtype=q_t.dtype)
    rnn.step(q_t[0], k_t[0], v_t[0])
    rnn.reset()
    per_token = np.empty(len(q_t))
    for t in range(len(q_t)):
        token = q_t[t], k_t[t], v_t[t]
        start = time.perf_counter()
        rnn.step(*token)
        per_token[t] = time.perf_counter() - start
    return per_token


def state_pass_seconds(q_t, v_t, calls=1024):
    """Seconds of each of ``calls`` passes that read and write an array the size of the RNN
    state of these tokens, S (..., F, M) and z (..., F) with F = D, in one call
    ``np.add(state, 1, out=state)``: the least a step can cost, a floor to compare the step
    with (it includes one NumPy call's overhead, as the step includes one Python call's)."""
    lead, d, m = q_t.shape[1:-1], q_t.shape[-1], v_t.shape[-1]
    state = np.zeros((*lead, d, m + 1), dtype=q_t.dtype)       # S and z side by side
    np.add(state, 1, out=state)
    per_call = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter()
        np.add(state, 1, out=state)
        per_call[i] = time.perf_counter() - start
    return per_call


def generation(cfg, progress):
    """Seconds per generated token against position, for ``cfg.heads`` heads of one sequence:
    the RNN step (every position), softmax with a key/value cache and recomputing causal
    linear attention over the whole prefix (at positions 2^j); and, to compare early and late
    positions, the first and the last 1024 steps taken again in turn (``_first_and_last``)."""
    n = cfg.gen_positions
    q, k, v, _ = inputs(1, cfg.heads, n, cfg.dim, cfg.value_dim, cfg.dtype, seed=1)
    q_t, k_t, v_t = tokens(q, k, v)
    rows = []
    advance(progress, f"generation: RNN step x {n}")
    linear_attention_step(q_t[0], k_t[0], v_t[0])                 # warm-up: load the kernel
    timing.settle(cfg.pause)
    # each position's median over several scans: the first steps of a scan run on cold
    # caches, and one scan's timer would read them as a cost of the position
    per_token = np.median([step_seconds(q_t, k_t, v_t) for _ in range(max(3, cfg.repeats))],
                          axis=0)
    for t in _positions(n):
        window = per_token[max(0, t - max(1, t // 8)):t]  # the tokens just before position t
        rows.append({"case": "rnn step", "position": t, "seconds_per_token":
                     float(np.median(window))})
    for t in _positions(n):
        advance(progress, f"generation: softmax cache, recompute t={t}")
        prefix = q[:, :, :t], k[:, :, :t], v[:, :, :t]
        f = functools.partial(softmax_cache_step, q[:, :, t - 1], *prefix[1:])
        rows.append({"case": "softmax kv-cache numpy", "position": t,
                     "seconds_per_token": timing.seconds(f, cfg.repeats)[0]})
        f = functools.partial(linear_attention, *prefix, causal=True)
        rows.append({"case": "recompute prefix numba", "position": t,
                     "seconds_per_token": timing.seconds(f, cfg.repeats)[0]})
    first, last = _first_and_last(q_t, k_t, v_t, min(1024, n))
    summary = {"median_s": float(np.median(per_token)),
               "first_1024_median_s": float(np.median(first)),
               "last_1024_median_s": float(np.median(last))}
    return rows, summary


def _first_and_last(q_t, k_t, v_t, w):
    """Seconds per step of the first ``w`` tokens and of the last ``w``, the two scans
    stepped in turn (the last from the state the tokens before them leave), so that a
    passing load weighs on both alike."""
    late = None
    for t in range(len(q_t) - w):                             # the state before the last w
        _, late = linear_attention_step(q_t[t], k_t[t], v_t[t], late)
    starts, states = (0, len(q_t) - w), [None, late]
    seconds = np.empty((2, w))
    for i in range(w):
        for j, start in enumerate(starts):
            t = start + i
            begin = time.perf_counter()
            _, states[j] = linear_attention_step(q_t[t], k_t[t], v_t[t], states[j])
            seconds[j, i] = time.perf_counter() - begin
    return seconds


def softmax_cache_step(q_t, k_cache, v_cache):
    """One generated token of softmax attention, Eq. (2) for the newest query q_t (..., D)
    against the cached keys and values (..., t, D|M): O(t) work, growing with the position.
    Cross-attention of one query (no mask: every cached key is visible), NumPy backend."""
    return softmax_attention(q_t[..., None, :], k_cache, v_cache, backend="numpy")[..., 0, :]


def advance(progress, label):
    """One more case on the ``tqdm`` bar ``progress``, named ``label``."""
    progress.set_postfix_str(label, refresh=False)
    progress.update()


def _positions(n):
    """1, 2, 4, ..., n (n included)."""
    return sorted({2**j for j in range(n.bit_length()) if 2**j <= n} | {n})
