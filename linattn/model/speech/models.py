"""The models of the speech experiment, section 4.3 and Table 3 of Katharopoulos et al.
(2020), arXiv:2006.16236: a bidirectional LSTM or a non-causal transformer encoder (softmax,
linear, or LSH attention once ``attention.attend`` knows it) scoring every frame, trained
with CTC. Here they run on a SYNTHETIC stand-in for WSJ (``speech.task``), not on speech.

One config, ``SpeechConfig``, names the model and all sizes; ``forward``/``backward`` and
``loss_and_grads`` dispatch on ``cfg.model`` to ``lstm`` or ``encoder``. The loss is the CTC
negative log-likelihood summed over the batch and divided by the number of labels: nats per
phoneme.
Reference: tests/test_model_speech.py (finite differences of the whole loss, both models).
"""
import json
from typing import NamedTuple

import numpy as np

from . import encoder, lstm
from ..config import ATTENTIONS, DTYPES, ModelConfig, check_config
from .ctc import ctc_loss_and_backward, greedy_decode
from ..layers import ACTIVATIONS

MODELS = ("linear", "softmax", "lsh", "bilstm")


class SpeechConfig(NamedTuple):
    """A speech model's kind and sizes.

    model : "bilstm", or the attention of a transformer encoder: "linear", "softmax" or
        "lsh" (Reformer attention of ``n_hashes`` rounds in chunks of ``lsh_chunk_size``;
        the paper's speech experiment ran lsh-4).
    n_features, n_classes : inputs per frame F and output classes C (blank included).
    d_model, n_layers, n_heads, d_mlp, feature_map, activation : the encoder's
        (see ``ModelConfig``); unused by "bilstm".
    hidden, lstm_layers : the Bi-LSTM's units per direction and layers; unused by encoders.
    max_frames : the longest utterance accepted.
    dtype : "float32" (training) or "float64" (gradient checks).
    """

    model: str = "linear"
    n_features: int = 40
    n_classes: int = 41
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_mlp: int = 256
    feature_map: str = "elu+1"
    activation: str = "gelu"
    hidden: int = 64
    lstm_layers: int = 2
    max_frames: int = 4096
    dtype: str = "float32"
    n_hashes: int = 4
    lsh_chunk_size: int = 32

    def encoder_config(self):
        """The transformer encoder's ModelConfig: non-causal, sinusoidal positions,
        ``vocab_size`` = C output classes."""
        return ModelConfig(vocab_size=self.n_classes, max_len=self.max_frames,
                           d_model=self.d_model, n_layers=self.n_layers,
                           n_heads=self.n_heads, d_mlp=self.d_mlp, attention=self.model,
                           feature_map=self.feature_map, activation=self.activation,
                           positions="sinusoidal", dtype=self.dtype, causal=False,
                           n_hashes=self.n_hashes, lsh_chunk_size=self.lsh_chunk_size)

    def to_json(self):
        """The config as a JSON string (what checkpoints store)."""
        return json.dumps(self._asdict(), sort_keys=True)

    @classmethod
    def from_json(cls, text):
        """The inverse of ``to_json``; ValueError for missing or unknown fields."""
        fields = json.loads(text)
        if not isinstance(fields, dict) or set(fields) != set(cls._fields):
            raise ValueError(f"speech config must have the fields {cls._fields}, got {text!r}")
        return check_speech_config(cls(**fields))


def check_speech_config(cfg):
    """Return ``cfg`` if every field is valid, else a ValueError naming the field."""
    for field in ("n_features", "n_classes", "hidden", "lstm_layers", "max_frames"):
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"SpeechConfig.{field} must be a positive integer, got {value!r}")
    if cfg.n_classes < 2:
        raise ValueError(f"SpeechConfig.n_classes counts the blank and at least one label, "
                         f"got {cfg.n_classes}")
    if cfg.model not in MODELS:
        raise ValueError(f"SpeechConfig.model must be one of {', '.join(MODELS)}, got "
                         f"{cfg.model!r}")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"SpeechConfig.dtype must be one of {', '.join(DTYPES)}, got "
                         f"{cfg.dtype!r}")
    if cfg.activation not in ACTIVATIONS:
        raise ValueError(f"SpeechConfig.activation must be one of {', '.join(ACTIVATIONS)}, "
                         f"got {cfg.activation!r}")
    if cfg.model != "bilstm":
        if cfg.model not in ATTENTIONS:
            raise ValueError(f"speech model {cfg.model!r} needs {cfg.model} attention, which "
                             f"this build of linattn lacks (it has {', '.join(ATTENTIONS)})")
        check_config(cfg.encoder_config())
    return cfg


def init_params(cfg, seed=0):
    """Random parameters of ``cfg``'s model, deterministic in ``seed`` (see
    ``lstm.init_params`` and ``encoder.init_params``)."""
    check_speech_config(cfg)
    if cfg.model == "bilstm":
        return lstm.init_params(cfg.n_features, cfg.hidden, cfg.lstm_layers, cfg.n_classes,
                                seed, cfg.dtype)
    return encoder.init_params(cfg.encoder_config(), cfg.n_features, seed)


def _check_frames(cfg, features, input_lengths):
    features = np.asarray(features)
    if features.ndim != 3 or features.shape[2] != cfg.n_features or features.dtype.kind != "f":
        raise ValueError(f"features must be a float array of shape (B, T, {cfg.n_features}), "
                         f"got {features.dtype} {features.shape}")
    if features.shape[1] > cfg.max_frames:
        raise ValueError(f"{features.shape[1]} frames exceed max_frames {cfg.max_frames}")
    lengths = np.asarray(input_lengths)
    if (lengths.shape != features.shape[:1] or lengths.dtype.kind not in "iu"
            or np.any(lengths < 1) or np.any(lengths > features.shape[1])):
        raise ValueError(f"input_lengths must be {features.shape[0]} integers in "
                         f"1..{features.shape[1]}, got {input_lengths!r}")
    return features.astype(cfg.dtype, copy=False), lengths.astype(np.int64)


def forward(params, cfg, features, input_lengths, path="lean"):
    """Per-frame class scores of ``cfg.model``.

    Parameters
    ----------
    params : dict from ``init_params``
    cfg : SpeechConfig
    features : ndarray, shape (B, T, n_features)
    input_lengths : ndarray of int, shape (B,)
    path : {"lean", "reference"}
        Which blocks compute an encoder (``model.paths``); the Bi-LSTM has one path.

    Returns
    -------
    logits : ndarray, shape (B, T, n_classes)
    cache : the model's cache (``lstm.LSTMCache`` or ``encoder.EncoderCache``)
    """
    features, lengths = _check_frames(cfg, features, input_lengths)
    if cfg.model == "bilstm":
        return lstm.forward(params, features, lengths)
    return encoder.forward(params, cfg.encoder_config(), features, lengths, path)


def backward(dlogits, params, cfg, features, input_lengths, cache, path="lean"):
    """Backward of ``forward`` (``path`` as given to it): (dfeatures, grads shaped like
    params)."""
    features, lengths = _check_frames(cfg, features, input_lengths)
    if cfg.model == "bilstm":
        return lstm.backward(dlogits, params, lengths, cache)
    return encoder.backward(dlogits, params, cfg.encoder_config(), features, lengths, cache,
                            path)


def loss_and_grads(params, cfg, batch, path="lean"):
    """CTC loss in nats per label, sum_b nll_b / sum_b L_b, and its parameter gradients.

    Parameters
    ----------
    params : dict, cfg : SpeechConfig
    batch : ``task.Batch`` (features, input_lengths, labels, label_lengths)
    path : {"lean", "reference"}
        Which blocks compute an encoder (``model.paths``); the same loss and gradients up
        to rounding.

    Returns
    -------
    loss : float
    grads : dict, shaped like params
    """
    logits, cache = forward(params, cfg, batch.features, batch.input_lengths, path)
    n_labels = max(int(np.sum(batch.label_lengths)), 1)
    dnll = np.full(logits.shape[0], 1.0 / n_labels, dtype=logits.dtype)
    nll, dlogits = ctc_loss_and_backward(dnll, logits, batch.input_lengths, batch.labels,
                                         batch.label_lengths)
    _, grads = backward(dlogits, params, cfg, batch.features, batch.input_lengths, cache,
                        path)
    return float(np.sum(nll, dtype=np.float64) / n_labels), grads


def decode(params, cfg, batch):
    """Greedy CTC decoding of a batch: a list of label lists."""
    logits, _ = forward(params, cfg, batch.features, batch.input_lengths)
    return greedy_decode(logits, batch.input_lengths)
