"""A SYNTHETIC phoneme-recognition task: a stand-in for the Wall Street Journal corpus of the
speech experiment, section 4.3 and Table 3 of Katharopoulos et al. (2020), arXiv:2006.16236.

WSJ is licensed and out of reach here, so nothing in this module is speech. It imitates the
shape of the problem: frames of 40 "filterbank" features, a phoneme string to recover with
CTC, phonemes held for a varying number of frames. Its numbers are not comparable with the
paper's phoneme error rates (Bi-LSTM 10.94, softmax 5.12, LSH-4 9.33, linear 8.08).

An utterance, deterministic in (task seed, split, index):
  1. a phoneme string of ``min_phonemes..max_phonemes`` symbols drawn from ``n_phonemes``
     with Zipf-like frequencies p_k ~ 1 / sqrt(k + 1), so one phoneme is the most frequent;
  2. a speaking rate r drawn per utterance in [min_hold, max_hold], and each phoneme held
     for round(r e^(0.3 n)) frames, n standard normal, clipped to min_hold..max_hold;
  3. each frame is its phoneme's template (a random spectrum over ``n_features`` channels,
     smoothed across neighbouring channels, normalised), and the frames are averaged over
     time with a triangular window of half-width ``coarticulation``: at each boundary the
     neighbouring phonemes blend over that many frames on either side;
  4. a random gain in [0.7, 1.3] and a per-channel offset (std 0.3) per utterance, then
     Gaussian noise of std ``noise`` on every feature.
The defaults give about 100-900 frames (mean about 375) and 20-80 labels per utterance.

Classes: 0 is the CTC blank, phoneme k is class k + 1. The training, validation and test
splits draw their utterances from separate seeds; the templates are shared.

Outputs that ignore the audio (``trivial_per``): empty output has PER 1 exactly; the best
constant output, the most frequent phoneme repeated, has PER 0.913 on the default test
split (phoneme 1 ten times). A model is learning only well below that.
"""
from typing import NamedTuple

import numpy as np

SPLITS = {"train": 1, "valid": 2, "test": 3}


class Utterance(NamedTuple):
    """features (T, n_features) float32 and labels (L,) int64, classes 1..n_phonemes."""

    features: np.ndarray
    labels: np.ndarray


class Batch(NamedTuple):
    """A padded batch: features (B, T_max, F) with zero frames past input_lengths (B,),
    labels (B, L_max) padded with the blank past label_lengths (B,)."""

    features: np.ndarray
    input_lengths: np.ndarray
    labels: np.ndarray
    label_lengths: np.ndarray


class SpeechTask(NamedTuple):
    """The SYNTHETIC phoneme-recognition task (not speech; see the module docstring).

    n_phonemes, n_features : symbols and feature channels (40 and 40, as filterbanks).
    min_phonemes, max_phonemes : phonemes per utterance.
    min_hold, max_hold : frames per phoneme.
    coarticulation : frames over which neighbouring phonemes blend on each side.
    noise : std of the Gaussian noise on each feature (templates have unit variance).
    n_train, n_valid, n_test : utterances per split.
    seed : of the templates and of every utterance.
    """

    n_phonemes: int = 40
    n_features: int = 40
    min_phonemes: int = 20
    max_phonemes: int = 80
    min_hold: int = 3
    max_hold: int = 12
    coarticulation: int = 2
    noise: float = 1.5
    n_train: int = 1000
    n_valid: int = 100
    n_test: int = 100
    seed: int = 0

    blank = 0

    @property
    def n_classes(self):
        """C: the phonemes and the blank."""
        return self.n_phonemes + 1

    def templates(self):
        """One spectrum per phoneme, (n_phonemes, n_features): normal, smoothed by a
        [1, 2, 1] / 4 window across channels (neighbouring filterbank channels overlap),
        then centred and scaled to unit variance."""
        rng = np.random.default_rng([self.seed, 0])
        raw = rng.standard_normal((self.n_phonemes, self.n_features + 2))
        smooth = (raw[:, :-2] + 2 * raw[:, 1:-1] + raw[:, 2:]) / 4
        smooth -= smooth.mean(axis=1, keepdims=True)
        return smooth / smooth.std(axis=1, keepdims=True)

    def frequencies(self):
        """Phoneme probabilities, p_k proportional to 1 / sqrt(k + 1)."""
        p = 1 / np.sqrt(np.arange(1, self.n_phonemes + 1))
        return p / p.sum()

    def utterance(self, split, index, templates=None):
        """Utterance ``index`` of ``split`` ("train", "valid" or "test"), steps 1-4 above.
        ``templates``: ``self.templates()``, passed in to save recomputing it."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        templates = self.templates() if templates is None else templates
        rng = np.random.default_rng([self.seed, SPLITS[split], index])
        n = int(rng.integers(self.min_phonemes, self.max_phonemes + 1))
        phones = rng.choice(self.n_phonemes, size=n, p=self.frequencies())
        rate = rng.uniform(self.min_hold, self.max_hold)              # speaking rate
        hold = np.clip(np.rint(rate * np.exp(0.3 * rng.standard_normal(n))),
                       self.min_hold, self.max_hold).astype(np.int64)
        frames = templates[np.repeat(phones, hold)]                   # (T, F)
        frames = _blend(frames, self.coarticulation)
        gain = rng.uniform(0.7, 1.3)
        offset = 0.3 * rng.standard_normal(self.n_features)
        x = gain * frames + offset + self.noise * rng.standard_normal(frames.shape)
        return Utterance(x.astype(np.float32), (phones + 1).astype(np.int64))

    def split(self, name):
        """Every utterance of split ``name``, a list of ``Utterance``."""
        size = {"train": self.n_train, "valid": self.n_valid, "test": self.n_test}[name]
        templates = self.templates()
        return [self.utterance(name, i, templates) for i in range(size)]


def _blend(frames, half_width):
    """Average frames over time with the triangular window (1, 2, ..., w + 1, ..., 2, 1),
    normalised, w = half_width; the first and last frames are repeated at the edges."""
    if half_width == 0:
        return frames
    w = half_width
    kernel = np.concatenate([np.arange(1, w + 2), np.arange(w, 0, -1)]) / (w + 1) ** 2
    padded = np.concatenate([np.repeat(frames[:1], w, 0), frames, np.repeat(frames[-1:], w, 0)])
    n = len(frames)
    return sum(kernel[j] * padded[j:j + n] for j in range(2 * w + 1))


def pad_batch(utterances, blank=0):
    """Pad a list of ``Utterance`` into a ``Batch`` (features with zeros, labels with the
    blank), keeping their order."""
    b = len(utterances)
    t_max = max(len(u.features) for u in utterances)
    l_max = max(len(u.labels) for u in utterances)
    features = np.zeros((b, t_max, utterances[0].features.shape[1]), dtype=np.float32)
    labels = np.full((b, l_max), blank, dtype=np.int64)
    for k, u in enumerate(utterances):
        features[k, :len(u.features)] = u.features
        labels[k, :len(u.labels)] = u.labels
    return Batch(features, np.array([len(u.features) for u in utterances]), labels,
                 np.array([len(u.labels) for u in utterances]))


def epoch_batches(frame_counts, batch_size, seed, epoch):
    """The batches of one training epoch, as lists of utterance indices.

    Utterances are sorted by length and cut into consecutive batches, so each batch holds
    utterances of similar length and padding stays small; the order of the batches is
    shuffled by ``(seed, epoch)``. A function of its arguments only, so a resumed run sees
    the batches it would have seen.
    """
    order = np.argsort(np.asarray(frame_counts), kind="stable")
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    shuffle = np.random.default_rng([seed, 4, epoch]).permutation(len(batches))
    return [batches[i] for i in shuffle]


def trivial_per(train_labels, refs):
    """The phoneme error rate of outputs that ignore the audio.

    Empty output: every reference label deleted, PER = 1 exactly. The best constant output
    is the training set's most frequent phoneme m repeated n times, with n chosen for the
    lowest PER on ``refs``: against a reference of L labels, c of them m, the edit distance
    of m^n is max(n, L) - min(n, c) (each match saves one edit; the rest are substitutions,
    deletions or insertions).

    Parameters
    ----------
    train_labels : list of label arrays (to find m)
    refs : list of label arrays (the references scored)

    Returns
    -------
    dict with ``empty`` (1.0), ``constant`` (the best constant output's PER), ``phoneme`` (m)
    and ``repeats`` (n).
    """
    counts = np.bincount(np.concatenate(train_labels))
    m = int(counts.argmax())
    lengths = np.array([len(r) for r in refs])
    hits = np.array([np.count_nonzero(np.asarray(r) == m) for r in refs])
    n = np.arange(lengths.max() + 1)[:, None]                         # candidate repeats
    edits = (np.maximum(n, lengths) - np.minimum(n, hits)).sum(axis=1)
    best = int(edits.argmin())
    return {"empty": 1.0, "constant": float(edits[best] / lengths.sum()), "phoneme": m,
            "repeats": best}
