"""The two tasks of the experiments, section 4.1 and 4.2.1 of Katharopoulos et al. (2020),
arXiv:2006.16236: the synthetic copy task and autoregressive image generation, here on the
8x8 handwritten digits that ship inside scikit-learn (an optional extra, ``linattn[digits]``;
read from the installed package, never from the network).

A task hands out batches ``(ids, targets, weights)`` of shape (B, N): the model reads
``ids``, must predict ``targets`` (ids shifted by one), and ``weights`` marks which
positions count towards the loss. Training batches are drawn from ``batch_rng(seed, step)``,
a pure function of the step, so a resumed run sees exactly the batches it would have seen.
"""
from typing import NamedTuple

import numpy as np


def batch_rng(seed, step, stream=0):
    """The random generator of batch ``step`` in ``stream`` (0: training, 1: held out)."""
    return np.random.default_rng([seed, stream, step])


class CopyTask(NamedTuple):
    """Copy a random string: [SEP, w, SEP, w], w drawn from ``n_symbols`` symbols.

    Ids 0..n_symbols-1 are symbols, ``n_symbols`` the separator and ``n_symbols + 1``
    padding. ``length`` is the longest w; with ``variable`` each sequence draws its own
    length from 1..length and is padded after its copy. The loss counts only the copied
    half, the part a model can predict. The paper's setting (128 positions, 10 symbols) is
    ``length=63``: 2 * 63 + 2 = 128 tokens, of which the model reads N = 127.
    """

    length: int = 16
    n_symbols: int = 10
    variable: bool = True

    @property
    def sep(self):
        return self.n_symbols

    @property
    def pad(self):
        return self.n_symbols + 1

    @property
    def vocab_size(self):
        return self.n_symbols + 2

    @property
    def seq_len(self):
        """N, the positions the model reads: 2 * length + 1."""
        return 2 * self.length + 1

    def strings(self, rng, batch_size):
        """Random strings w (B, length) and their lengths (B,); symbols past a length are
        padding."""
        lengths = (rng.integers(1, self.length + 1, size=batch_size) if self.variable
                   else np.full(batch_size, self.length))
        w = rng.integers(0, self.n_symbols, size=(batch_size, self.length))
        w = np.where(np.arange(self.length) < lengths[:, None], w, self.pad)
        return w, lengths

    def batch(self, rng, batch_size):
        """(ids, targets, weights), each (B, N): seq = [SEP, w, SEP, w, PAD...] and
        ids = seq[:-1], targets = seq[1:], weights 1 on the copied symbols."""
        w, lengths = self.strings(rng, batch_size)
        seq = np.full((batch_size, 2 * self.length + 2), self.pad)
        seq[:, 0] = self.sep
        seq[:, 1:self.length + 1] = w
        rows, cols = np.nonzero(np.arange(self.length) < lengths[:, None])
        seq[np.arange(batch_size), lengths + 1] = self.sep     # the second separator
        seq[rows, cols + lengths[rows] + 2] = w[rows, cols]    # the copy
        targets = seq[:, 1:]
        copy_pos = np.arange(seq.shape[1] - 1)[None, :]        # target t is seq[t + 1]
        weights = ((copy_pos >= lengths[:, None] + 1) & (copy_pos < 2 * lengths[:, None] + 1))
        return seq[:, :-1], targets, weights.astype(np.float64)

    def prompts(self, rng, batch_size):
        """Prompts [SEP, w, SEP] of one common length and the strings w to copy, for
        checking generation: returns (prompt (B, length + 2), w (B, length))."""
        fixed = self._replace(variable=False)
        w, _ = fixed.strings(rng, batch_size)
        sep = np.full((batch_size, 1), self.sep)
        return np.concatenate([sep, w, sep], axis=1), w


class DigitsTask(NamedTuple):
    """Pixel-by-pixel generation of digits with 17 grey levels (0..16), 8x8 by default.

    A sequence is [START, p_1, ..., p_P] with START = 17 and P pixels (64 at 8x8); the model
    reads N = P ids and predicts the P pixels, so the loss in nats / ln 2 is bits per
    dimension (section 4.2). ``train`` and ``test`` hold the pixel values, (n_images, P)
    integers.
    """

    train: np.ndarray
    test: np.ndarray

    levels = 17
    vocab_size = 18
    start = 17

    @property
    def seq_len(self):
        """N, the pixels of an image (64 at 8x8)."""
        return self.train.shape[1]

    def _sequences(self, images):
        start = np.full((images.shape[0], 1), self.start)
        seq = np.concatenate([start, images], axis=1)
        return seq[:, :-1], seq[:, 1:], np.ones(images.shape, dtype=np.float64)

    def batch(self, rng, batch_size):
        """A batch of training images, drawn with replacement: (ids, targets, weights)."""
        return self._sequences(self.train[rng.integers(0, len(self.train), batch_size)])

    def test_batches(self, batch_size):
        """The whole test split in consecutive batches of (ids, targets, weights)."""
        return [self._sequences(self.test[i:i + batch_size])
                for i in range(0, len(self.test), batch_size)]


def load_digits(n_test=297, seed=0, side=8):
    """scikit-learn's 1797 handwritten digits as a ``DigitsTask``, split by a fixed
    permutation (``seed``) into 1500 training and ``n_test`` test images.

    ``side`` > 8 resamples each image to side x side pixels (``upsample``): longer sequences
    of the same 1797 drawings, which adds no information; the model must learn the
    interpolation as well as the digits.

    Raises ImportError, saying how to install the extra, when scikit-learn is missing.
    """
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as err:
        raise ImportError("the digits task needs scikit-learn, an optional extra: "
                          "pip install 'linattn[digits]'") from err
    images = sklearn_digits().data.astype(np.int64)           # (1797, 64), values 0..16
    if side != 8:
        images = upsample(images.reshape(-1, 8, 8), side).reshape(len(images), side * side)
    order = np.random.default_rng(seed).permutation(len(images))
    return DigitsTask(train=images[order[n_test:]], test=images[order[:n_test]])


def upsample(images, side):
    """Images (n, h, w) of grey levels 0..16 resampled to (n, side, side) by bilinear
    interpolation (pixel centres aligned, edges held), rounded back to the levels 0..16."""
    n, h, w = images.shape

    def weights(size):                                # (side, size) interpolation matrix
        x = np.clip((np.arange(side) + 0.5) * size / side - 0.5, 0, size - 1)
        lo = np.floor(x).astype(int)
        hi = np.minimum(lo + 1, size - 1)
        a = np.zeros((side, size))
        a[np.arange(side), lo] += 1 - (x - lo)
        a[np.arange(side), hi] += x - lo
        return a
    out = np.einsum("yh,nhw,xw->nyx", weights(h), images.astype(np.float64), weights(w))
    return np.clip(np.rint(out), 0, 16).astype(np.int64)
