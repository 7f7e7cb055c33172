"""Causal linear attention as a stateful RNN, section 3.4 of Katharopoulos et al. (2020),
"Transformers are RNNs", arXiv:2006.16236: the object a generation loop holds.

    s_0 = 0, z_0 = 0                                                  Eq. (16)-(17)
    s_i = s_{i-1} + phi(k_i) v_i^T,  z_i = z_{i-1} + phi(k_i)          Eq. (18)-(19)
    out_i = phi(q_i)^T s_i / (phi(q_i)^T z_i + eps)                   Eq. (20), attention part

``linattn.linear_attention_step`` computes the same step as a pure function: it checks its
inputs, picks a kernel and returns a new state on every call. ``Recurrence`` does that work
once, in its constructor, owns the state and updates it in place, so that a step costs one
pass over the state plus a few comparisons. The functional step is its reference: scanning
it gives the same outputs (tests/test_recurrence.py).
"""
from . import _checks, _gates, dispatch
from .feature_maps import get_feature_map
from .forms.recurrent import CompensatedState, State, zero_state


class Recurrence:
    """The RNN of Eq. (16)-(20) for a fixed batch of sequences, stepped one token at a time.

    Parameters
    ----------
    lead_shape : tuple of int
        The leading axes of every input, e.g. (batch, heads); () for a single sequence.
    d : int
        D, the width of queries and keys.
    m : int
        M, the width of values.
    feature_map : {"elu+1", "relu", "taylor", "favor"} or object
        phi, as for ``linear_attention``; its width F is found by applying it to a zero row.
    eps : float
        Added to the normaliser phi(q_i)^T z_i.
    dtype : {"float32", "float64"}
        The dtype of the inputs, the state and the outputs.
    backend : {"auto", "numpy", "numba", "cupy"}
        "auto" is "numba" when numba imports, else "numpy" (a constructor sees no arrays, so
        it never picks "cupy": ask for it, and pass CuPy arrays to ``step``). "numba" runs one
        compiled call a step, elu+1 included.
    compensated : bool
        Add by Kahan's compensated summation: the state carries, beside S and z, the rounding
        error each has lost so far (a ``CompensatedState``), and its error relative to the
        exact sums stays at a few units of the dtype's rounding however many steps are
        taken, where a plain float32 sum drifts like u sqrt(N). Notebook 09 measures it
        against float64, and what it costs.
    initial_state : State or CompensatedState, optional
        The state to start from instead of zeros, copied: e.g. what
        ``linear_attention(..., causal=True, return_state=True)`` returned for a prompt, so
        that generation continues it (a CompensatedState when ``compensated``).
    decay : float or ndarray, shape broadcasting to lead_shape, optional
        gamma in (0, 1] (RetNet's decay): every step first multiplies S and z by gamma.
    gated : bool
        Each ``step`` takes a log gate ``log_gate_t`` (*lead_shape, F) (GLA's gate):
        S = diag(exp(g_t)) S + phi(k_t) v_t^T, z likewise. With ``decay`` the two multiply.
    normalize : bool
        False reads out phi(q_t)^T S_t alone (RetNet; z is still carried).
        A decay, a gate and normalize=False run the NumPy step (``forms.decay_recurrent``),
        not with ``compensated``; ``linear_attention_step`` with the same keywords is their
        reference.

    Attributes
    ----------
    lead_shape, d, m, feature_width (F), dtype, compensated
        As given (F as found). Read-only: the state was allocated for them, so setting one
        is an AttributeError; build a new Recurrence for other sizes.
    backend : str
        The backend "auto" resolved to (read-only).

    Raises
    ------
    TypeError, ValueError
        Bad sizes, dtype, eps or names.
    ImportError, RuntimeError
        backend="cupy" without CuPy, or without a GPU.

    Examples
    --------
    >>> import numpy as np
    >>> rnn = Recurrence((8,), 64, 64)                      # 8 heads, D = M = 64, float32
    >>> q_t = k_t = v_t = np.ones((8, 64), np.float32)      # one token's projections
    >>> rnn.step(q_t, k_t, v_t).shape
    (8, 64)

    Cost: O(lead F M) memory for the state (twice that when compensated), O(F M) time per
    step and leading index.
    """

    # every attribute, all private: no new ones, and the public ones are read-only properties
    __slots__ = ("_lead_shape", "_d", "_m", "_feature_width", "_dtype", "_compensated",
                 "_backend", "_phi", "_fused", "_step_into", "_xp", "_eps", "_qk_shape",
                 "_v_shape", "_state", "_gate", "_gated", "_normalize")

    def __init__(self, lead_shape, d, m, *, feature_map="elu+1", eps=1e-6, dtype="float32",
                 backend="auto", compensated=False, initial_state=None, decay=None,
                 gated=False, normalize=True):
        lead, d, m, dtype = _checks.check_recurrence(lead_shape, d, m, dtype)
        eps = _checks.check_eps(eps)
        self._compensated = _checks.check_flag("compensated", compensated)
        self._gated = _checks.check_flag("gated", gated)
        self._normalize = _checks.check_gating(True, decay, None, normalize)
        self._phi = get_feature_map(feature_map)
        xp = _checks.backend_array_module(backend)
        needs = dispatch.needed(decay=decay, log_gate=self._gated or None,
                                unnormalized=not self._normalize)
        if needs and self._compensated:
            raise ValueError("compensated=True does not take a decay, gated=True or "
                             "normalize=False: Kahan's sums add, a decay also multiplies")
        kernel, self._backend = dispatch.kernel("step", "auto", backend, xp, needs=needs)
        self._fused = dispatch.fuses(kernel, self._phi)
        self._step_into = (kernel.step_into_compensated if self._compensated
                           else kernel.step_into)     # (phi_q, phi_k, v, *state, out, eps)
        f = self._phi.forward(xp.zeros((1, d), dtype=dtype)).shape[-1]
        self._lead_shape, self._d, self._m, self._feature_width = lead, d, m, f
        self._dtype = dtype
        self._xp, self._eps = xp, dtype.type(eps)         # eps in the state's dtype
        self._qk_shape, self._v_shape = (*lead, d), (*lead, m)
        self._state = zero_state(lead, f, m, dtype, xp, self._compensated)
        self._gate = _gates.step_gate(decay, None, xp.zeros((*lead, f), dtype=dtype))
        if needs and self._gate is None:                 # normalize=False or gated alone
            self._gate = xp.zeros((*lead, f), dtype=dtype)
        start = _checks.check_state(initial_state, (*lead, f, m), dtype, xp, self.compensated,
                                    name="initial_state")
        for a, given in zip(self._state, start or ()):
            a[...] = given                       # a copy: the Recurrence owns its state

    lead_shape = property(lambda self: self._lead_shape,
                          doc="The leading axes of every input, a tuple of int.")
    d = property(lambda self: self._d, doc="D, the width of queries and keys.")
    m = property(lambda self: self._m, doc="M, the width of values.")
    feature_width = property(lambda self: self._feature_width,
                             doc="F, the width of phi(q) and phi(k).")
    dtype = property(lambda self: self._dtype, doc="The dtype of inputs, state and outputs.")
    compensated = property(lambda self: self._compensated,
                           doc="Whether the state is added by Kahan's compensated summation.")
    backend = property(lambda self: self._backend, doc="The backend that computes a step.")

    def step(self, q_t, k_t, v_t, log_gate_t=None):
        """One token: update the state in place, Eq. (18)-(19), and read it out, Eq. (20).

        Parameters
        ----------
        q_t, k_t : ndarray, shape (*lead_shape, D)
        v_t : ndarray, shape (*lead_shape, M)
            Arrays of the constructor's dtype and array module; any strides.
        log_gate_t : ndarray, shape broadcasting to (*lead_shape, F)
            This token's log gate g_t <= 0; required with ``gated=True``, refused without.

        Returns
        -------
        out_t : ndarray, shape (*lead_shape, M)
            A new array: phi(q_t)^T S_t / (phi(q_t)^T z_t + eps).

        Raises TypeError (array type, dtype) or ValueError (shape; a whole sequence
        (*lead_shape, N, D) is named as one) before the state is touched. Cost: O(F M) per
        leading index, one pass over the state (two, compensated).
        """
        dtype = self._dtype
        if (type(q_t) is not self._xp.ndarray or type(k_t) is not self._xp.ndarray
                or type(v_t) is not self._xp.ndarray or q_t.dtype is not dtype
                or k_t.dtype is not dtype or v_t.dtype is not dtype
                or q_t.shape != self._qk_shape or k_t.shape != self._qk_shape
                or v_t.shape != self._v_shape):
            # the few comparisons above are all a step checks; this names what differs, or
            # lets through what only looked different (an equal dtype object, a subclass)
            q_t, k_t, v_t = _checks.check_recurrence_step(q_t, k_t, v_t, self._qk_shape,
                                                          self._v_shape, dtype, self._xp)
        out = self._xp.empty(self._v_shape, dtype)
        if self._gate is not None:
            self._step_into(self._phi.forward(q_t), self._phi.forward(k_t), v_t,
                            *self._state, out, self._eps, self._step_gate(log_gate_t),
                            self._normalize)
        elif log_gate_t is not None:
            raise ValueError("log_gate_t needs a Recurrence built with gated=True")
        elif self._fused:                  # raw q_t and k_t: the kernel applies elu+1
            self._step_into(q_t, k_t, v_t, *self._state, out, self._eps, True)
        else:
            self._step_into(self._phi.forward(q_t), self._phi.forward(k_t), v_t,
                            *self._state, out, self._eps)
        return out

    def _step_gate(self, log_gate_t):
        """This step's log gate: the decay's, plus ``log_gate_t`` when gated."""
        if self._gated != (log_gate_t is not None):
            raise ValueError("a Recurrence built with gated=True takes log_gate_t at every "
                             "step, and one built without takes none")
        if log_gate_t is None:
            return self._gate
        return self._gate + _checks.check_log_gate(log_gate_t, self._gate.shape, self._dtype,
                                                   self._xp, name="log_gate_t")

    @property
    def state(self):
        """A copy of the state: ``State(S, z)``, or ``CompensatedState(S, z, S_c, z_c)`` when
        compensated; S (*lead_shape, F, M), z (*lead_shape, F). A snapshot: later steps do
        not change it, and changing it does not change the Recurrence. Passing it to
        ``linear_attention_step`` (with the same ``compensated``) continues the sequence."""
        kind = CompensatedState if self._compensated else State
        return kind(*(a.copy() for a in self._state))

    def reset(self):
        """Zero the state (and its compensation), Eq. (16)-(17): a new sequence starts."""
        for a in self._state:
            a.fill(0)

    def __repr__(self):
        return (f"Recurrence(lead_shape={self.lead_shape}, d={self.d}, m={self.m}, "
                f"feature_map={self._phi!r} (F={self.feature_width}), dtype={self.dtype}, "
                f"backend={self.backend!r}, compensated={self.compensated})")

