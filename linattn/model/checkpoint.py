"""Checkpoints: parameters, Adam state, step and configs in one ``.npz`` file.

The file is written atomically: to a temporary file in the same directory, flushed to disk,
then renamed over the target, so a crash mid-save leaves the last good checkpoint intact.
Loading checks the file thoroughly (format tag, configs, every array's name, shape and
dtype) and turns a truncated, corrupt or mismatched file into a ``CheckpointError`` that
names the file and the problem. Arrays are stored without pickling. The config is a
``ModelConfig`` (the decoder) or a ``speech.SpeechConfig``; ``config_type`` names which
(files without it hold a ModelConfig).
"""
import json
import os
import tempfile
import zipfile
from typing import NamedTuple

import numpy as np

from .speech import models as speech
from .config import ModelConfig
from .optim import AdamState
from .transformer import init_params

FORMAT = "linattn-checkpoint-1"
# config class name -> (class, the init_params that gives its parameters' names and shapes)
CONFIG_TYPES = {"ModelConfig": (ModelConfig, init_params),
                "SpeechConfig": (speech.SpeechConfig, speech.init_params)}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, incomplete or for another model."""


class Checkpoint(NamedTuple):
    """What a checkpoint holds: the model config, parameters, optimiser state, and ``meta``,
    a dict of JSON-able settings (task, training and optimiser configs)."""

    config: object
    params: dict
    opt_state: AdamState
    meta: dict


def save_checkpoint(path, config, params, opt_state, meta=None):
    """Write a checkpoint to ``path`` atomically (temporary file, fsync, rename).

    Parameters
    ----------
    path : str or os.PathLike
    config : ModelConfig or SpeechConfig
    params : dict of str -> ndarray
    opt_state : AdamState
    meta : dict, optional
        Extra JSON-able settings, returned unchanged by ``load_checkpoint``.
    """
    if type(config).__name__ not in CONFIG_TYPES:
        raise TypeError(f"config must be one of {', '.join(CONFIG_TYPES)}, got "
                        f"{type(config).__name__}")
    arrays = {"format": np.array(FORMAT), "config": np.array(config.to_json()),
              "config_type": np.array(type(config).__name__),
              "meta": np.array(json.dumps(meta or {}, sort_keys=True)),
              "step": np.array(opt_state.step, dtype=np.int64)}
    for name in params:
        arrays[f"param/{name}"] = params[name]
        arrays[f"adam_m/{name}"] = opt_state.m[name]
        arrays[f"adam_v/{name}"] = opt_state.v[name]
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".npz.tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)                  # atomic on POSIX and Windows
    except BaseException:
        os.unlink(tmp)
        raise


def _read(path):
    """Every array in the file, read fully (so CRC errors surface here), as a dict."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated or corrupt?): "
                              f"{err}") from err


def _text(arrays, key, path):
    if key not in arrays or arrays[key].dtype.kind != "U" or arrays[key].ndim != 0:
        raise CheckpointError(f"checkpoint {path} has no valid {key!r} entry")
    return str(arrays[key])


def load_checkpoint(path, expect=None):
    """Read a checkpoint written by ``save_checkpoint``.

    Parameters
    ----------
    path : str or os.PathLike
    expect : ModelConfig or SpeechConfig, optional
        If given, the checkpoint's model config must equal it.

    Returns
    -------
    Checkpoint

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    CheckpointError
        The file is truncated or corrupt, is not a linattn checkpoint, or its config or
        arrays do not match (the message names the field or array).
    """
    arrays = _read(path)
    if _text(arrays, "format", path) != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {arrays['format']}, "
                              f"expected {FORMAT}")
    kind = _text(arrays, "config_type", path) if "config_type" in arrays else "ModelConfig"
    if kind not in CONFIG_TYPES:
        raise CheckpointError(f"checkpoint {path} has an unknown config type {kind!r}")
    config_class, init = CONFIG_TYPES[kind]
    try:
        config = config_class.from_json(_text(arrays, "config", path))
        meta = json.loads(_text(arrays, "meta", path))
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} has an invalid config: {err}") from err
    if expect is not None and type(config) is not type(expect):
        raise CheckpointError(f"checkpoint {path} holds a {kind}, expected a "
                              f"{type(expect).__name__}")
    if expect is not None and config != expect:
        diff = {f: (getattr(config, f), getattr(expect, f))
                for f in config._fields if getattr(config, f) != getattr(expect, f)}
        raise CheckpointError(f"checkpoint {path} is for another model; (saved, expected): "
                              f"{diff}")
    want = init(config)                        # names, shapes and dtypes to check against
    names = {k.split("/", 1)[1] for k in arrays if k.startswith("param/")}
    if names != set(want):
        raise CheckpointError(f"checkpoint {path} parameters do not match its config: "
                              f"missing {sorted(set(want) - names)}, "
                              f"unexpected {sorted(names - set(want))}")
    parts = {}
    for kind in ("param", "adam_m", "adam_v"):
        parts[kind] = {}
        for name, ref in want.items():
            a = arrays.get(f"{kind}/{name}")
            if a is None or a.shape != ref.shape or a.dtype != ref.dtype:
                got = "missing" if a is None else f"{a.dtype} {a.shape}"
                raise CheckpointError(f"checkpoint {path}: {kind}/{name} is {got}, "
                                      f"expected {ref.dtype} {ref.shape}")
            parts[kind][name] = a
    step = arrays.get("step")
    if step is None or step.shape != () or step.dtype.kind not in "iu" or step < 0:
        raise CheckpointError(f"checkpoint {path} has no valid step count")
    opt_state = AdamState(int(step), parts["adam_m"], parts["adam_v"])
    return Checkpoint(config, parts["param"], opt_state, meta)
