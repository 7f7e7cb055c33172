"""The model's hyper-parameters: one NamedTuple, checked once, stored in checkpoints as JSON.

The architecture is the decoder-only transformer of Katharopoulos et al. (2020),
arXiv:2006.16236, section 3.1 (Eq. 1): L pre-norm blocks of attention and an MLP, with the
attention either softmax (Eq. 2, causal mask of Eq. 8), causal linear (Eq. 9) or the
paper's second baseline, Reformer (LSH) attention (``linattn.lsh``); or one of three
causal variants beyond the paper (``model.variants``): a learned decay, GLA's gates, the
delta rule. With ``causal=False``
the same blocks form the non-causal encoder of the speech experiment (section 4.3): softmax
Eq. (2) without the mask, linear attention Eq. (5), LSH without its mask.
"""
import json
from typing import NamedTuple

from ..feature_maps import FEATURE_MAPS
from .layers import ACTIVATIONS

# the causal variants beyond the paper (``model.variants``): decoders only, reference path
VARIANTS = ("decay", "gated", "delta")
ATTENTIONS = ("linear", "softmax", "lsh", *VARIANTS)
POSITIONS = ("sinusoidal", "learned")
DTYPES = ("float32", "float64")
# fields added after checkpoints were first written: a saved config without them gets these
LATER_FIELDS = {"causal": True, "n_hashes": 1, "lsh_chunk_size": 32}  # absent before


class ModelConfig(NamedTuple):
    """A decoder-only transformer's shape and choices.

    vocab_size : number of token ids V.
    max_len : longest sequence the model may see (learned positions need it; generation
        checks it).
    d_model, n_layers, n_heads, d_mlp : widths and depth; d_model must divide by n_heads.
    attention : "linear", "softmax" or "lsh" (Reformer, shared QK: the q projection), or
        a causal variant beyond the paper (``model.variants``, reference path only):
        "decay" (linear attention whose state decays by a learned gamma_h = sigmoid(a_h)
        per head), "gated" (GLA's per-position, per-feature gate from the layer's input)
        or "delta" (the delta rule, write strength beta from the layer's input).
    feature_map : phi of linear attention, a name from ``linattn.feature_maps.FEATURE_MAPS``.
    activation : the MLP's nonlinearity, "gelu" or "relu".
    positions : "sinusoidal" (fixed) or "learned" position embeddings.
    dtype : "float32" (training) or "float64" (gradient checks).
    n_hashes, lsh_chunk_size : hash rounds and chunk size of "lsh" attention (ignored
        otherwise); a config stored without them (before they existed) loads with these
        defaults.
    causal : True: position i attends to j <= i (a decoder, Eq. 8 / 9); False: to every
        position (an encoder, Eq. 2 / 5).
    """

    vocab_size: int
    max_len: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_mlp: int = 256
    attention: str = "linear"
    feature_map: str = "elu+1"
    activation: str = "gelu"
    positions: str = "sinusoidal"
    dtype: str = "float32"
    n_hashes: int = 1
    lsh_chunk_size: int = 32
    causal: bool = True

    @property
    def d_head(self):
        return self.d_model // self.n_heads

    def to_json(self):
        """The config as a JSON string (what checkpoints store)."""
        return json.dumps(self._asdict(), sort_keys=True)

    @classmethod
    def from_json(cls, text):
        """The inverse of ``to_json``; ValueError for missing or unknown fields (only the
        ``LATER_FIELDS`` may be missing: they take their defaults)."""
        fields = json.loads(text)
        if isinstance(fields, dict):
            fields = {**LATER_FIELDS, **fields}
        if not isinstance(fields, dict) or set(fields) != set(cls._fields):
            raise ValueError(f"model config must have the fields {cls._fields}, got {text!r}")
        return check_config(cls(**fields))



def _choice(cfg, field, valid):
    value = getattr(cfg, field)
    if value not in valid:
        raise ValueError(f"ModelConfig.{field} must be one of {', '.join(valid)}, got {value!r}")


def check_config(cfg):
    """Return ``cfg`` if every field is valid, else a ValueError naming the field."""
    for field in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads", "d_mlp",
                  "n_hashes", "lsh_chunk_size"):
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"ModelConfig.{field} must be a positive integer, got {value!r}")
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"ModelConfig.d_model ({cfg.d_model}) must be divisible by "
                         f"n_heads ({cfg.n_heads})")
    if cfg.positions == "sinusoidal" and cfg.d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got {cfg.d_model}")
    _choice(cfg, "attention", ATTENTIONS)
    _choice(cfg, "feature_map", tuple(FEATURE_MAPS))
    _choice(cfg, "activation", tuple(ACTIVATIONS))
    _choice(cfg, "positions", POSITIONS)
    _choice(cfg, "dtype", DTYPES)
    if not isinstance(cfg.causal, bool):
        raise ValueError(f"ModelConfig.causal must be True or False, got {cfg.causal!r}")
    if cfg.attention in VARIANTS and not cfg.causal:
        raise ValueError(f"ModelConfig.attention {cfg.attention!r} is causal only (its state "
                         f"is carried forward in time): it needs causal=True")
    return cfg
