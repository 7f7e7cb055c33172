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
argument and prints one JSON object::

    {"layers": 8, "heads": 8, "d_model": 256, "d_mlp": 1024, "vocab": 256, "n": 784,
     "batches": [1, 16], "rounds": 3, "threads": 2}
    -> {"torch": "2.x", "fast_transformers": "0.4.0", "threads": 2, "blas": "mkl",
        "rows": [{"batch": 1, "seconds": median, "best_seconds": best}, ...]}

``seconds`` is the median over ``rounds`` of the wall time to generate ``n`` tokens after one
start token for the whole batch (``timing.seconds``), after a short warm-up generation.
"""
import json
import re
import sys

# the sibling module, found through this script's folder: this script runs in the peers'
# interpreter, which has no linattn installed
from timing import seconds

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


def main(config):
    import fast_transformers
    import torch
    torch.set_num_threads(config["threads"])
    step = build(torch, config)
    rows = []
    for batch in config["batches"]:
        generate(torch, step, batch, min(WARMUP_TOKENS, config["n"]))   # warm-up
        median, best = seconds(lambda: generate(torch, step, batch, config["n"]),
                               repeats=config["rounds"], warmup=0)
        rows.append({"batch": batch, "seconds": median, "best_seconds": best})
    version = getattr(fast_transformers, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("pytorch-fast-transformers")
    return {"torch": torch.__version__, "fast_transformers": version,
            "threads": torch.get_num_threads(), "blas": _blas(torch),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),   # its vector kernels
            "rows": rows}


def _blas(torch):
    """The BLAS torch was built with, from its build configuration (e.g. "mkl")."""
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return found.group(1) if found else "unknown"


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
