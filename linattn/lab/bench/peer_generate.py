"""The paper authors' recurrent model generating images, timed like ``linattn.lab.speed``
times ours: pytorch-fast-transformers' ``RecurrentEncoderBuilder`` with linear attention
(elu(x) + 1 feature map, Eq. 7 of Katharopoulos et al. 2020, arXiv:2006.16236), the
transformer run as an RNN token by token (section 3.4, Eq. 16-20), float32, greedy.

The model has the sizes it is given (the paper's MNIST model: 8 layers, 8 heads of 32,
d_model 256, an MLP of 1024, GELU), random weights, and around the encoder what a pixel
model needs: a token embedding and a learned position embedding in, a linear projection to
the vocabulary out, the argmax picking the next token. pft's layers are post-norm (ours are
pre-norm): the same operations in another order, the same cost.

Run as a script by an interpreter that has torch and fast_transformers (``--peer-python``);
it never imports linattn, and linattn never imports it. It reads one JSON configuration
argument, prints one JSON line about itself, then answers requests on its standard input,
one JSON line each, until the input closes::

    argv: {"layers": 8, "heads": 8, "d_model": 256, "d_mlp": 1024, "vocab": 256, "n": 784,
           "threads": 2}
    out:  {"torch": "2.x", "fast_transformers": "0.4.0", "threads": 2, "blas": "mkl",
           "cpu_capability": "AVX2"}
    in:   {"batch": 16}   ->   out: {"batch": 16, "seconds": 9.1}

A request is one timed generation of ``n`` tokens after one start token for the whole batch
(``timing.once``), after a short warm-up generation the first time a batch size is asked
for: so ``linattn.lab.speed`` can time this model's rounds and linattn's in turn.
"""
import json
import re
import sys

# the sibling module, found through this script's folder: this script runs in the peers'
# interpreter, which has no linattn installed
from timing import once

WARMUP_TOKENS = 16


def build(torch, config):
    """``step(tokens, t, state) -> (next tokens, state)`` of a random
    recurrent linear transformer of the configured sizes, in eval mode."""
    from fast_transformers.builders import RecurrentEncoderBuilder
    torch.manual_seed(0)
    d_head = config["d_model"] // config["heads"]
    encoder = RecurrentEncoderBuilder.from_kwargs(
        n_layers=config["layers"], n_heads=config["heads"], query_dimensions=d_head,
        value_dimensions=d_head, feed_forward_dimensions=config["d_mlp"],
        attention_type="linear", activation="gelu", dropout=0.0).get().eval()
    embed = torch.nn.Embedding(config["vocab"], config["d_model"])
    positions = torch.nn.Embedding(config["n"] + 1, config["d_model"])
    project = torch.nn.Linear(config["d_model"], config["vocab"])

    def step(tokens, t, state):
        x = embed(tokens) + positions.weight[t]                    # (B, d_model)
        h, state = encoder(x, state)                               # one RNN step per layer
        return project(h).argmax(dim=-1), state                    # greedy: (B,)
    return step


def generate(torch, step, batch, n):
    """Generate ``n`` tokens after one start token (id 0) for ``batch`` sequences."""
    tokens, state = torch.zeros(batch, dtype=torch.int64), None
    with torch.no_grad():
        for t in range(n):
            tokens, state = step(tokens, t, state)
    return tokens


def about(torch, fast_transformers):
    """The versions, threads, BLAS and vector kernels this interpreter runs with."""
    version = getattr(fast_transformers, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("pytorch-fast-transformers")
    return {"torch": torch.__version__, "fast_transformers": version,
            "threads": torch.get_num_threads(), "blas": _blas(torch),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}   # its vector kernels


def serve(config, requests, reply):
    """Build the model, ``reply`` with ``about``, then with one timed generation for each
    request of ``requests`` (an iterable of JSON lines)."""
    import fast_transformers
    import torch
    torch.set_num_threads(config["threads"])
    step = build(torch, config)
    reply(about(torch, fast_transformers))
    warm = set()
    for line in requests:
        batch = json.loads(line)["batch"]
        if batch not in warm:
            generate(torch, step, batch, min(WARMUP_TOKENS, config["n"]))
            warm.add(batch)
        reply({"batch": batch,
               "seconds": once(lambda: generate(torch, step, batch, config["n"]))})


def _blas(torch):
    """The BLAS torch was built with, from its build configuration (e.g. "mkl")."""
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return found.group(1) if found else "unknown"


def _print_line(obj):
    print(json.dumps(obj), flush=True)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]), sys.stdin, _print_line)
