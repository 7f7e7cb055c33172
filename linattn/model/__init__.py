"""A linear transformer trained by hand-written backpropagation and generating as an RNN:
the experiments of section 4 of Katharopoulos et al. (2020), arXiv:2006.16236, in NumPy.

Two paths compute the same model (``paths`` chooses, nothing else does):
- the reference, what to read: ``layers`` (linear, layer norm, GELU/ReLU, embedding,
  cross-entropy), ``attention`` (multi-head wrapper over the core), ``transformer`` (the
  model, forward and backward), ``optim`` (Adam) and ``token_step`` (one generated token:
  the RNN form, the key/value cache), all NumPy;
- the compiled path, ``fast``: the same functions with compiled element loops and fewer
  passes over memory, held to the reference by the tests. It runs by default
  (``path="lean"``) in ``loss_and_grads``, ``adam_update``, ``TrainConfig`` and
  ``generate``; ``path="reference"`` runs the reference instead.

Around them: ``config``, ``checkpoint``, ``train`` (the resumable loop), ``generate`` (RNN
form, key/value cache, recomputation), ``tasks`` (copy task, digits), ``cli``.
The speech experiment (section 4.3), on SYNTHETIC data, is the subpackage ``speech``:
``task`` (the data), ``ctc`` (loss, decoding, error rate), ``lstm`` (Bi-LSTM), ``encoder``
(non-causal transformer), ``models`` (the models behind one config), ``train``.
"""
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .config import ModelConfig
from .speech.ctc import (ctc_loss, ctc_loss_and_backward, ctc_loss_backward, edit_distance,
                         greedy_decode, phoneme_error_rate)
from .generate import generate
from .optim import AdamConfig, AdamState, adam_init
from .paths import PATHS, adam_update, loss_and_grads
from .speech.models import SpeechConfig
from .speech.task import SpeechTask, trivial_per
from .speech.train import SpeechTrainConfig, evaluate_per, run_speech, speech_curves
from .tasks import CopyTask, DigitsTask, load_digits
from .train import TrainConfig, copy_task_curves, evaluate, read_log, run
from .transformer import backward, forward, init_params

__all__ = [
    "ModelConfig", "init_params", "forward", "backward", "loss_and_grads", "PATHS",
    "AdamConfig", "AdamState", "adam_init", "adam_update",
    "save_checkpoint", "load_checkpoint", "CheckpointError",
    "TrainConfig", "run", "evaluate", "read_log", "copy_task_curves", "generate",
    "CopyTask", "DigitsTask", "load_digits",
    "ctc_loss", "ctc_loss_backward", "ctc_loss_and_backward", "greedy_decode", "edit_distance",
    "phoneme_error_rate",
    "SpeechConfig", "SpeechTask", "trivial_per", "SpeechTrainConfig", "run_speech",
    "evaluate_per", "speech_curves",
]
