"""The benchmark's peers: PyTorch's softmax attention and the paper authors' library,
pytorch-fast-transformers (its causal and non-causal linear attention, its Reformer, and
the recurrent step), timed like linattn in ``timing``, float32.

Run as a script by ``python -m linattn.lab.bench`` with an interpreter that has torch
(``--peer-python``), since the peers are an optional extra; it reads one JSON configuration
argument and prints one JSON object: the cases of ``SCALING`` at every N (``main``), or, for
one round of the benchmark's head-to-head, each peer of its pairs and pft's step
(``head_to_head``).
It never imports linattn, and linattn never imports it.
"""
import json
import sys
import time

import numpy as np

# the sibling module, found through this script's folder: this script runs in the peers'
# interpreter, which has no linattn installed
from timing import over_budget, peak_rss_bytes, point, seconds


# the cases timed at every N (the others only in the head-to-head)
SCALING = ("torch softmax", "pft causal linear", "pft linear non-causal")


def cases(torch, b, h, n, d, m, eps):
    """name -> (forward, forward + backward), each a closure over fixed random inputs.

    PyTorch takes (batch, heads, N, D); pft's attention modules take
    (batch, N, heads, D), so their inputs and dout are transposed copies.
    """
    import torch.nn.functional as functional
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b, h, n, d, generator=gen) for _ in range(2))
    v, dout = (torch.randn(b, h, n, m, generator=gen) for _ in range(2))

    def leaf(x):
        return x.detach().contiguous().requires_grad_()

    table = {"torch softmax": (lambda q, k, v: functional.scaled_dot_product_attention(
        q, k, v, is_causal=True), tuple(map(leaf, (q, k, v))), dout),
        "torch softmax non-causal": (lambda q, k, v: functional.scaled_dot_product_attention(
            q, k, v), tuple(map(leaf, (q, k, v))), dout)}
    try:
        from fast_transformers.attention import CausalLinearAttention, LinearAttention
        from fast_transformers.masking import FullMask, LengthMask, TriangularCausalMask
    except ImportError:
        pass
    else:
        lengths = LengthMask(torch.full((b,), n, dtype=torch.int64))
        causal, full = CausalLinearAttention(d, eps=eps), LinearAttention(d, eps=eps)
        seq = tuple(leaf(x.transpose(1, 2)) for x in (q, k, v))     # (batch, N, heads, D)
        dout_seq = dout.transpose(1, 2).contiguous()
        table["pft causal linear"] = (
            lambda q, k, v: causal(q, k, v, TriangularCausalMask(n), lengths, lengths),
            seq, dout_seq)
        table["pft linear non-causal"] = (
            lambda q, k, v: full(q, k, v, FullMask(n), lengths, lengths), seq, dout_seq)
        if n % 32 == 0:                        # pft's Reformer needs whole chunks
            for rounds in (1, 4):
                table[f"pft reformer-{rounds}"] = (_reformer(torch, n, rounds, lengths),
                                                   seq[:1] + seq[2:], dout_seq)
    return {name: _runners(torch, *entry) for name, entry in table.items()}


def _reformer(torch, n, rounds, lengths):
    """pft's ReformerAttention with linattn's LSH settings: chunks of 32, as many buckets
    (2 x bits) as linattn's default 2 ceil(N / 32), ``rounds`` rounds, no dropout, queries as
    keys. Its ``masked=True`` (no attention to oneself, as linattn) adds an N x N matrix, so
    it is left False; its rounds are averaged with equal weights."""
    from fast_transformers.attention import ReformerAttention
    from fast_transformers.masking import FullMask
    module = ReformerAttention(chunk_size=32, bits=-(-n // 32), rounds=rounds,
                               attention_dropout=0.0)
    return lambda qk, v: module(qk, qk, v, FullMask(n), lengths, lengths)


def _runners(torch, forward, args, dout):
    """(forward without autograd, forward + backward through autograd)."""
    def infer():
        with torch.no_grad():
            forward(*args)

    def train():
        for x in args:
            x.grad = None
        forward(*args).backward(dout)
    return infer, train


def generation(torch, h, d, m, positions):
    """Seconds per token of pft's RecurrentLinearAttention step at each position, batch 1,
    on one thread like linattn's steps (``Recurrence.step`` and ``linear_attention_step`` run
    one serial compiled loop): a token's work is too small to share."""
    from fast_transformers.recurrent.attention import RecurrentLinearAttention
    torch.set_num_threads(1)
    step = RecurrentLinearAttention(d)
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(positions, 1, h, d, generator=gen) for _ in range(2))
    v = torch.randn(positions, 1, h, m, generator=gen)
    per_token, state = np.empty(positions), None
    with torch.no_grad():
        for t in range(positions):
            token = q[t], k[t], v[t]                   # indexing is not the step's work
            start = time.perf_counter()
            _, state = step(*token, state=state)
            per_token[t] = time.perf_counter() - start
    return per_token


def head_to_head(torch, config):
    """Best seconds of the forward and forward + backward of each case in
    ``config["cases"]`` at N = ``config["n"]`` (``"NAME forward_s"``, ``"NAME
    forward_backward_s"``; cases this interpreter lacks are left out), and the median
    seconds per token of pft's step over ``config["steps"]`` tokens (``"step_s"``)."""
    table = cases(torch, config["batch"], config["heads"], config["n"], config["dim"],
                  config["value_dim"], config["eps"])
    result = {}
    for name in config["cases"]:
        if name in table:
            forward, both = table[name]
            result[f"{name} forward_s"] = seconds(forward, config["repeats"])[1]
            result[f"{name} forward_backward_s"] = seconds(both, config["repeats"])[1]
    if "pft causal linear" in table:
        per_token = generation(torch, config["heads"], config["dim"], config["value_dim"],
                               config["steps"])                    # on one thread: after
        result["step_s"] = float(np.median(per_token))
    return result


def main(config):
    import torch
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(), "scaling": [],
              "cpu_capability": torch.backends.cpu.get_cpu_capability()}  # its vector kernels
    try:
        import fast_transformers  # noqa: F401
        result["fast_transformers"] = True
    except ImportError:
        result["fast_transformers"] = False
    stopped = set()
    for n in config["ns"]:
        tokens = config.get("tokens")
        batch = config["batch"] if tokens is None else max(1, tokens // n)
        table = cases(torch, batch, config["heads"], n, config["dim"],
                      config["value_dim"], config["eps"])
        for name, (forward, both) in table.items():
            if name not in SCALING or name in stopped or not (
                    name == "torch softmax" or n <= config["max_linear_n"]):
                continue
            warm = any(row["case"] == name for row in result["scaling"])
            row = {"case": name, "n": n, "batch": batch}
            (row["forward_s"], row["forward_best_s"], row["forward_backward_s"],
             row["forward_backward_best_s"]) = point(forward, both, config["repeats"], warm)
            row["peak_rss_bytes"] = peak_rss_bytes(both)
            result["scaling"].append(row)
            if over_budget(row["forward_backward_s"], config["budget"], batch, n, tokens):
                stopped.add(name)
    return result


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    if config.get("head_to_head"):
        import torch
        print(json.dumps(head_to_head(torch, config)))
    else:
        print(json.dumps(main(config)))
