"""Reading a prompt before generating: every prompt position at once, one parallel causal
call per layer, instead of one RNN step per token. Section 3.4 of Katharopoulos et al.
(2020), arXiv:2006.16236: causal linear attention computed in parallel (Eq. 9) ends in the
state the RNN (Eq. 16-20) reaches after the same positions,

    S_P = sum_{j<P} phi(k_j) v_j^T,   z_P = sum_{j<P} phi(k_j),

so generation continues from it as if it had stepped through the prompt. A softmax layer's
memory is its keys and values, which the same pass computes for all prompt positions.

``read_prompt`` runs the reference blocks (Eq. 1, pre-norm, as ``transformer.block``) over
the prompt, the attention by ``linattn.linear_attention(..., causal=True,
return_state=True)`` or causal ``linattn.softmax_attention``, and keeps each layer's memory.
The last block's attention output and MLP are not computed: no memory depends on them.
Both generation paths start from it (``token_step.next_logits``, ``fast.token_loop``).
The variants beyond the paper read the prompt the same way (``variants.attend`` with
``return_state=True``): the decayed or gated state (S, z), or the delta rule's memory S.
Reference: stepping through the prompt a token at a time (``token_step.step``);
tests/test_model_generate.py holds the memories to it in float64, and the generated tokens
to its tokens.
"""
from ..linear import linear_attention
from ..softmax import softmax_attention
from . import variants
from .attention import merge_heads, split_heads
from .config import VARIANTS
from .layers import layer_norm, linear
from .transformer import block_params, embed, mlp


def read_prompt(params, cfg, ids):
    """Each layer's memory after the positions 0..P-1 of ``ids``.

    Parameters
    ----------
    params : dict, cfg : ModelConfig (causal; linear, softmax or a variant's attention)
    ids : ndarray of int, shape (B, P), P >= 1

    Returns
    -------
    memories : tuple, one per layer: ``State(S, z)`` of the RNN, S (B, H, F, d_head) and z
        (B, H, F) (linear attention, "decay", "gated"), S (B, H, F, d_head) ("delta"), or
        the keys and values (k, v), (B, H, P, d_head) each (softmax).

    Cost: O(L B P d_model (d_model + d_mlp)) plus the attention, O(L B P d_model d_head)
    for linear, O(L B P^2 d_model) for softmax: the parallel forward, in a few calls per
    layer instead of P steps.
    """
    x = embed(params, cfg, ids)                                  # (B, P, d_model)
    memories = []
    for layer in range(cfg.n_layers):
        p = block_params(params, layer)
        h = layer_norm(x, p["ln1_g"], p["ln1_b"])
        q, k, v = (split_heads(linear(h, p["w" + n], p["b" + n]), cfg.n_heads)
                   for n in "qkv")                               # (B, H, P, d_head)
        if cfg.attention in VARIANTS:
            # the decayed or gated state, or the delta rule's memory, after the prompt
            out, memory = variants.attend(q, k, v, variants.gate_input(p, h, cfg), cfg,
                                          return_state=True)
        elif cfg.attention == "linear":
            # Eq. (9) for every position, and the state after the last: (S_P, z_P)
            out, memory = linear_attention(q, k, v, causal=True, feature_map=cfg.feature_map,
                                           return_state=True)
        else:
            out, memory = softmax_attention(q, k, v, causal=True), (k, v)    # Eq. (2), (8)
        memories.append(memory)
        if layer + 1 == cfg.n_layers:
            break                            # the last block's output feeds no memory
        x = x + linear(merge_heads(out), p["wo"], p["bo"])
        x = x + mlp(p, layer_norm(x, p["ln2_g"], p["ln2_b"]), cfg)[0]
    return tuple(memories)
