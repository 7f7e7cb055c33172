"""linattn: Transformers are RNNs (Katharopoulos et al., 2020, arXiv:2006.16236) in NumPy.

Softmax attention and linear attention in its quadratic, linear, chunked and recurrent
forms, and Reformer (LSH) attention, each with a hand-written backward pass; the RNN of
section 3.4 as a step function and as a stateful ``Recurrence``.
"""
from .feature_maps import EluPlusOne, Favor, ReLU, Taylor
from .forms.recurrent import CompensatedState, State
from .delta import delta_rule_attention, delta_rule_attention_backward, delta_rule_step
from .linear import linear_attention, linear_attention_backward, linear_attention_step
from .recurrence import Recurrence
from .lsh import lsh_attention, lsh_attention_backward, lsh_attention_mask
from .softmax import softmax_attention, softmax_attention_backward
from .warmup import warmup

__all__ = [
    "softmax_attention", "softmax_attention_backward",
    "linear_attention", "linear_attention_backward", "linear_attention_step", "State",
    "Recurrence", "CompensatedState",
    "lsh_attention", "lsh_attention_backward", "lsh_attention_mask",
    "delta_rule_attention", "delta_rule_attention_backward", "delta_rule_step",
    "EluPlusOne", "ReLU", "Taylor", "Favor", "warmup",
]
__version__ = "0.1.0"
