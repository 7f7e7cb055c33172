"""The training step's peer: the paper authors' own model, pytorch-fast-transformers'
``TransformerEncoder`` with causal linear attention (``TransformerEncoderBuilder``,
``attention_type="causal-linear"``), trained by PyTorch autograd and ``torch.optim.Adam``,
float32, for ``python -m linattn.lab.bench.train_step``.

The model around the encoder is linattn's copy-task model (``linattn.model.transformer``):
token embedding plus learned positions, the encoder (L layers, H heads of d_query, an MLP of
d_mlp with GELU, elu+1 features, eps 1e-6, no dropout), a final layer norm (the builder's
``final_normalization``), the output projection, and the cross-entropy averaged over the
positions whose weight is 1; one step is forward, backward, global-norm clipping to 1 and
Adam (beta2 = 0.98, eps = 1e-8). What still differs is listed in ``train_step``'s docstring.

Run as a script by the peers' interpreter (it never imports linattn, and linattn never
imports torch). Protocol, one JSON object a line: the first line on stdin is the
configuration (``threads``, ``vocab_size``, ``max_len``, ``d_model``, ``n_layers``,
``n_heads``, ``d_mlp``, ``lr``, ``batches``: {B: [ids, targets, weights]} as nested lists);
the script answers ``{"torch": version, "threads": n, "cpu_capability": c}`` (c: the
vector kernels torch picked, e.g. "AVX2" or "AVX512"), then, for each line
``{"batch": B, "repeats": r}``, times r steps on that batch after one untimed step and
answers ``{"median_s": ..., "best_s": ...}`` (``timing.seconds``). End of input ends it.
"""
import json
import sys

# the sibling module, found through this script's folder: this script runs in the peers'
# interpreter, which has no linattn installed
from timing import seconds


def build(torch, cfg):
    """(modules, loss function of (ids, targets, weights)) for the configuration ``cfg``."""
    from fast_transformers.builders import TransformerEncoderBuilder
    from fast_transformers.masking import TriangularCausalMask
    d = cfg["d_model"]
    encoder = TransformerEncoderBuilder.from_kwargs(
        n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
        query_dimensions=d // cfg["n_heads"], value_dimensions=d // cfg["n_heads"],
        feed_forward_dimensions=cfg["d_mlp"], attention_type="causal-linear",
        activation="gelu", dropout=0.0, attention_dropout=0.0).get()
    tok_emb = torch.nn.Embedding(cfg["vocab_size"], d)
    pos_emb = torch.nn.Parameter(torch.randn(cfg["max_len"], d))
    head = torch.nn.Linear(d, cfg["vocab_size"])
    modules = torch.nn.ModuleList([encoder, tok_emb, head])

    def loss(ids, targets, weights):
        n = ids.shape[1]
        x = tok_emb(ids) + pos_emb[:n]                               # (B, N, d_model)
        h = encoder(x, attn_mask=TriangularCausalMask(n))           # final LN included
        logits = head(h)                                             # (B, N, V)
        per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                      targets.reshape(-1), reduction="none")
        return (per_token * weights.reshape(-1)).sum() / weights.sum()
    return [*modules.parameters(), pos_emb], loss


def main():
    import torch
    cfg = json.loads(sys.stdin.readline())
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    params, loss_of = build(torch, cfg)
    adam = torch.optim.Adam(params, lr=cfg["lr"], betas=(0.9, 0.98), eps=1e-8)
    batches = {int(b): (torch.tensor(ids), torch.tensor(targets),
                        torch.tensor(weights, dtype=torch.float32))
               for b, (ids, targets, weights) in cfg["batches"].items()}

    def step(batch):
        adam.zero_grad(set_to_none=True)
        loss_of(*batch).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        adam.step()

    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()}),  # its kernels
          flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        batch = batches[request["batch"]]
        median, best = seconds(lambda: step(batch), request["repeats"])
        print(json.dumps({"median_s": median, "best_s": best}), flush=True)


if __name__ == "__main__":
    main()
