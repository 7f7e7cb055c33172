"""Which path computes the model: the one place that chooses.

The model of Katharopoulos et al. (2020), arXiv:2006.16236 (Eq. (1) with the attention of
Eq. (2)-(9)), is computed by one of two paths, the same functions up to rounding:

- ``"lean"``, the default: the compiled path of ``model.fast``. Training runs
  ``fast.lean.forward`` and ``backward`` (compiled element layers, activations kept) and
  ``fast.optim.adam_update`` (one compiled pass a parameter); the speech encoder runs its
  blocks, ``fast.lean.block`` and ``block_backward``; generation runs the token loop of
  ``fast.token_loop``.
- ``"reference"``: the NumPy model a student reads, ``transformer.forward`` and
  ``backward`` (``block`` and ``block_backward`` for the speech encoder),
  ``optim.adam_update``, and ``token_step.step`` a token at a time. It is
  what the lean path is tested against (tests/test_model_lean.py, test_model_optim.py,
  test_model_generate.py).

``TrainConfig(path=...)``, ``generate(..., path=...)`` and the functions below take the
name; ``resolve`` turns it into the path's functions. Nothing else in the model imports
``model.fast``.

The attentions beyond the paper (``config.VARIANTS``: "decay", "gated", "delta") exist on the
reference path only: ``resolve(path, cfg)`` gives a model with one of them the reference's
functions whatever ``path`` names (Adam, which reads no config, stays on the compiled pass),
and the compiled functions refuse such a config with a ValueError if called directly.
"""
from typing import Callable, NamedTuple

from . import optim, token_step, transformer
from .fast import lean, token_loop
from .config import VARIANTS
from .fast import optim as fast_optim
from .layers import cross_entropy, cross_entropy_backward

PATHS = ("lean", "reference")


class Path(NamedTuple):
    """One path's functions, with the reference's arguments and results:
    ``forward(params, cfg, ids) -> (logits, cache)``,
    ``backward(dlogits, params, cfg, cache) -> grads``,
    ``adam_update(params, grads, state, adam_cfg) -> (params, state, norm)``,
    ``next_logits(params, cfg, tokens, n_prompt)``: the next-token logits of each position
    from the prompt's last on, yielded one at a time (see ``token_step.next_logits``),
    ``block(p, x, cfg, lengths) -> (y, cache)`` and
    ``block_backward(dy, p, cache, cfg, lengths) -> (dx, grads)``: one block, for the
    speech encoder (``speech.encoder``)."""

    forward: Callable
    backward: Callable
    adam_update: Callable
    next_logits: Callable
    block: Callable
    block_backward: Callable


def resolve(path, cfg=None):
    """The functions of ``path``, "lean" or "reference"; else a ValueError naming both.
    With ``cfg`` a model whose attention the compiled path lacks (``config.VARIANTS``) gets
    the reference's model functions on either path, and the compiled Adam on "lean"."""
    if path == "lean" and cfg is not None and cfg.attention in VARIANTS:
        return resolve("reference")._replace(adam_update=fast_optim.adam_update)
    if path == "lean":
        return Path(lean.forward, lean.backward, fast_optim.adam_update,
                    token_loop.next_logits, lean.block, lean.block_backward)
    if path == "reference":
        return Path(transformer.forward, transformer.backward, optim.adam_update,
                    token_step.next_logits, transformer.block, transformer.block_backward)
    raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")


def loss_and_grads(params, cfg, ids, targets, weights=None, path="lean"):
    """Mean cross-entropy of next-token prediction and its gradient.

    Parameters
    ----------
    params : dict, from ``transformer.init_params``
    cfg : ModelConfig
    ids, targets : ndarray of int, shape (B, N)
        Inputs and the token each position must predict.
    weights : ndarray, shape (B, N), optional
        Which positions count (see ``layers.cross_entropy``).
    path : {"lean", "reference"}
        The path's forward and backward (see the module's docstring); the same loss and
        gradients up to rounding.

    Returns
    -------
    loss : float, nats per counted token
    grads : dict, shaped like params

    Cost: a forward and a backward, about three forwards.
    """
    run = resolve(path, cfg)
    logits, cache = run.forward(params, cfg, ids)
    loss = cross_entropy(logits, targets, weights)
    (dlogits,) = cross_entropy_backward(1.0, logits, targets, weights)
    return loss, run.backward(dlogits, params, cfg, cache)


def adam_update(params, grads, state, cfg, path="lean"):
    """One Adam step with clipping and warm-up (``optim.adam_update``, the reference) on
    ``path``: the same arguments and results (params, state, norm), the same numbers up to
    the last bit of the clipped norm."""
    return resolve(path).adam_update(params, grads, state, cfg)
