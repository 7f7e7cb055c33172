"""The speech experiment's models and SYNTHETIC task: the whole CTC loss's gradient against
central finite differences (float64) for the Bi-LSTM and the non-causal encoders, padded
batches equal to each utterance alone, the task's determinism and layout, and the trivial
baseline's closed form."""
import numpy as np
import pytest

from linattn.model.config import ATTENTIONS
from linattn.model.speech.ctc import ctc_loss, edit_distance
from linattn.model.speech.models import (SpeechConfig, check_speech_config, decode, forward,
                                  init_params, loss_and_grads)
from linattn.model.speech.task import SpeechTask, epoch_batches, pad_batch, trivial_per

from helpers import numerical_parameter_gradients

TINY_TASK = SpeechTask(n_phonemes=3, n_features=3, min_phonemes=1, max_phonemes=3,
                       min_hold=2, max_hold=3, n_train=4, n_valid=2, n_test=2)
TINY = dict(n_features=3, n_classes=4, d_model=8, n_layers=1, n_heads=2, d_mlp=8,
            hidden=3, lstm_layers=2, dtype="float64")
MODELS = [m for m in ("bilstm", "softmax", "linear") if m == "bilstm" or m in ATTENTIONS]


def _batch(task=TINY_TASK, split="train", n=3):
    batch = pad_batch([task.utterance(split, i) for i in range(n)])
    return batch._replace(features=batch.features.astype(np.float64))


def _loss(params, cfg, batch):
    """The loss alone, forward only: CTC nats per label."""
    logits, _ = forward(params, cfg, batch.features, batch.input_lengths)
    nll = ctc_loss(logits, batch.input_lengths, batch.labels, batch.label_lengths)
    return nll.sum() / batch.label_lengths.sum()




@pytest.mark.parametrize("model", [m if m == "bilstm" else pytest.param(m, marks=pytest.mark.slow)
                                   for m in MODELS])
def test_ctc_loss_gradient(model):
    cfg = SpeechConfig(model=model, **TINY)
    params = init_params(cfg, seed=1)
    batch = _batch()
    assert len(set(batch.input_lengths)) > 1                        # padding is exercised
    loss, grads = loss_and_grads(params, cfg, batch)
    want = numerical_parameter_gradients(params, lambda: _loss(params, cfg, batch))
    assert grads.keys() == params.keys() and np.isfinite(loss)
    # one scale for all: softmax's key bias has a true gradient of exactly 0
    scale = max(np.max(np.abs(w)) for w in want.values())
    for name in params:
        err = np.max(np.abs(grads[name] - want[name])) / scale
        assert err < 1e-7, f"{name}: error {err:.2e} relative to the largest gradient"


@pytest.mark.parametrize("model", MODELS)
def test_padded_batch_equals_each_utterance_alone(model):
    cfg = SpeechConfig(model=model, **TINY)
    params = init_params(cfg, seed=2)
    batch = _batch(n=4)
    logits, _ = forward(params, cfg, batch.features, batch.input_lengths)
    for b, n in enumerate(batch.input_lengths):
        alone, _ = forward(params, cfg, batch.features[b:b + 1, :n], [n])
        np.testing.assert_allclose(logits[b, :n], alone[0], rtol=1e-10, atol=1e-12)
    assert len(decode(params, cfg, batch)) == 4


def _noisy_padding(batch, seed):
    """``batch`` with loud random frames past each utterance's length instead of zeros."""
    real = np.arange(batch.features.shape[1]) < batch.input_lengths[:, None]      # (B, T)
    noise = 10 * np.random.default_rng(seed).standard_normal(batch.features.shape)
    return batch._replace(features=np.where(real[..., None], batch.features, noise))


def _alone(batch, b):
    """Utterance b of ``batch`` as a batch of one, without padding."""
    n, m = batch.input_lengths[b], batch.label_lengths[b]
    return batch._replace(features=batch.features[b:b + 1, :n],
                          input_lengths=batch.input_lengths[b:b + 1],
                          labels=batch.labels[b:b + 1, :m],
                          label_lengths=batch.label_lengths[b:b + 1])


@pytest.mark.parametrize("path", ["lean", "reference"])
@pytest.mark.parametrize("model", [m for m in MODELS if m != "bilstm"])
def test_padded_batch_loss_and_gradients_are_each_utterance_alone(model, path):
    # the batch's loss is sum_b nll_b / sum_b L_b, so it and its gradients are the
    # label-weighted sums of each utterance's alone; the padded frames hold loud noise,
    # which would reach every real frame if the attention read padded keys
    cfg = SpeechConfig(model=model, **TINY)
    params = init_params(cfg, seed=5)
    batch = _noisy_padding(_batch(n=4), seed=6)
    assert len(set(batch.input_lengths)) > 1                        # padding is exercised
    loss, grads = loss_and_grads(params, cfg, batch, path=path)
    want_loss, want = 0.0, {name: 0.0 for name in params}
    for b in range(len(batch.input_lengths)):
        loss_b, grads_b = loss_and_grads(params, cfg, _alone(batch, b), path=path)
        weight = batch.label_lengths[b] / batch.label_lengths.sum()
        want_loss += weight * loss_b
        want = {name: want[name] + weight * grads_b[name] for name in params}
    assert loss == pytest.approx(want_loss, rel=1e-12)
    scale = max(np.max(np.abs(w)) for w in want.values())
    for name in params:
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-10, atol=1e-13 * scale,
                                   err_msg=name)


@pytest.mark.parametrize("model", [m for m in MODELS if m != "bilstm"])
def test_padded_frames_would_show_without_the_mask(model):
    # the check above has power: read as real frames (no padding), the same noisy frames
    # change the first utterance's loss; and the lean path is the reference on padding
    cfg = SpeechConfig(model=model, **TINY)
    params = init_params(cfg, seed=5)
    batch = _noisy_padding(_batch(n=4), seed=6)
    short = int(np.argmin(batch.input_lengths))
    alone = _alone(batch, short)
    unmasked = alone._replace(features=batch.features[short:short + 1],
                              input_lengths=np.array([batch.features.shape[1]]))
    assert not np.isclose(_loss(params, cfg, unmasked), _loss(params, cfg, alone), rtol=1e-3)
    loss, grads = loss_and_grads(params, cfg, batch)
    want_loss, want = loss_and_grads(params, cfg, batch, path="reference")
    assert loss == pytest.approx(want_loss, rel=1e-12)
    for name in params:
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-10, atol=1e-14,
                                   err_msg=name)


@pytest.mark.parametrize("model", [m for m in MODELS if m != "bilstm"])
def test_encoder_reads_the_whole_utterance(model):
    # non-causal: the last frame changes the first frame's scores
    cfg = SpeechConfig(model=model, **TINY)
    params = init_params(cfg, seed=3)
    x = np.random.default_rng(4).standard_normal((1, 6, 3))
    first = forward(params, cfg, x, [6])[0][0, 0]
    x[0, -1] += 1.0
    assert not np.allclose(forward(params, cfg, x, [6])[0][0, 0], first)


def test_lsh_encoder_is_the_papers_lsh_4():
    cfg = check_speech_config(SpeechConfig(model="lsh"))
    enc = cfg.encoder_config()
    assert (enc.attention, enc.n_hashes, enc.causal) == ("lsh", 4, False)


@pytest.mark.parametrize("change, match", [
    (dict(model="gru"), "model must be one of"), (dict(hidden=0), "hidden"),
    (dict(n_classes=1), "n_classes"), (dict(d_model=10, n_heads=4), "divisible"),
    (dict(dtype="float16"), "dtype")])
def test_bad_configs_are_named(change, match):
    with pytest.raises(ValueError, match=match):
        check_speech_config(SpeechConfig(**change))


def test_bad_frames_are_named():
    cfg = SpeechConfig(model="bilstm", **TINY)
    params = init_params(cfg)
    with pytest.raises(ValueError, match="features must be"):
        forward(params, cfg, np.zeros((1, 4, 5)), [4])
    with pytest.raises(ValueError, match="input_lengths"):
        forward(params, cfg, np.zeros((1, 4, 3)), [5])


def test_config_json_round_trip():
    cfg = SpeechConfig(model="bilstm", hidden=7)
    assert SpeechConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="fields"):
        SpeechConfig.from_json('{"model": "linear"}')


def test_task_is_deterministic_and_splits_differ():
    task = SpeechTask()
    a, b = task.utterance("train", 5), task.utterance("train", 5)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.labels, b.labels)
    c = task.utterance("test", 5)
    assert a.labels.shape != c.labels.shape or np.any(a.labels != c.labels)
    assert task._replace(seed=1).utterance("train", 5).features.shape != a.features.shape or \
        not np.allclose(task._replace(seed=1).utterance("train", 5).features, a.features)
    for u in task.split("valid")[:30]:
        assert u.features.dtype == np.float32 and u.features.shape[1] == 40
        assert 20 <= len(u.labels) <= 80 and 1 <= u.labels.min() and u.labels.max() <= 40
        assert 3 * len(u.labels) <= len(u.features) <= 12 * len(u.labels)


def test_pad_batch_layout():
    utts = [TINY_TASK.utterance("train", i) for i in range(3)]
    batch = pad_batch(utts)
    assert batch.features.shape == (3, max(len(u.features) for u in utts), 3)
    for k, u in enumerate(utts):
        n, m = len(u.features), len(u.labels)
        assert batch.input_lengths[k] == n and batch.label_lengths[k] == m
        np.testing.assert_array_equal(batch.features[k, :n], u.features)
        assert np.all(batch.features[k, n:] == 0) and np.all(batch.labels[k, m:] == 0)
        np.testing.assert_array_equal(batch.labels[k, :m], u.labels)


def test_epoch_batches_cover_every_utterance_once():
    counts = np.random.default_rng(0).integers(50, 500, 23)
    batches = epoch_batches(counts, 5, seed=0, epoch=3)
    assert sorted(np.concatenate(batches).tolist()) == list(range(23))
    assert all(np.ptp(counts[b]) <= np.ptp(counts) for b in batches)
    assert [b.tolist() for b in batches] == [b.tolist() for b in epoch_batches(counts, 5, 0, 3)]
    assert [b.tolist() for b in batches] != [b.tolist() for b in epoch_batches(counts, 5, 0, 4)]


def test_trivial_per_closed_form_equals_edit_distance():
    rng = np.random.default_rng(1)
    refs = [rng.integers(1, 4, rng.integers(1, 9)) for _ in range(6)]
    got = trivial_per(refs, refs)
    m = got["phoneme"]
    total = sum(len(r) for r in refs)
    pers = [sum(edit_distance([m] * n, r) for r in refs) / total for n in range(9)]
    assert got["constant"] == pytest.approx(min(pers)) and got["empty"] == 1.0
    assert pers[got["repeats"]] == pytest.approx(min(pers))
