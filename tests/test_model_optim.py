"""Adam, gradient clipping and warm-up against hand computations; the compiled path's Adam
against the NumPy reference."""
import numpy as np
import pytest

from linattn.model.optim import (AdamConfig, adam_init, adam_update, clip_gradients,
                                 global_norm, learning_rate)


def test_warmup_ramps_linearly_then_holds():
    cfg = AdamConfig(lr=1e-2, warmup=4)
    np.testing.assert_allclose([learning_rate(cfg, s) for s in range(6)],
                               [2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2])
    assert learning_rate(cfg._replace(warmup=0), 0) == 1e-2


def test_clipping_scales_to_the_max_norm():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    assert global_norm(grads) == 5.0
    clipped, norm = clip_gradients(grads, 1.0)
    assert norm == 5.0 and np.isclose(global_norm(clipped), 1.0)
    np.testing.assert_allclose(clipped["a"], [0.6, 0.0])
    assert clip_gradients(grads, 10.0)[0] is grads            # under the limit: unchanged
    assert clip_gradients(grads, 0)[0] is grads               # 0 disables clipping


def test_adam_matches_hand_computed_steps():
    cfg = AdamConfig(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, warmup=1, clip=0)
    p = {"w": np.array([1.0, -2.0])}
    state = adam_init(p)
    g1, g2 = np.array([0.5, -1.0]), np.array([0.1, 0.3])
    p1, state, _ = adam_update(p, {"w": g1}, state, cfg)
    # first step: mhat = g, vhat = g^2, so the step is lr * sign(g)
    np.testing.assert_allclose(p1["w"], p["w"] - 0.1 * np.sign(g1), rtol=1e-7)
    p2, state, _ = adam_update(p1, {"w": g2}, state, cfg)
    m = 0.9 * 0.1 * g1 + 0.1 * g2
    v = 0.99 * 0.01 * g1**2 + 0.01 * g2**2
    want = p1["w"] - 0.1 * (m / (1 - 0.9**2)) / (np.sqrt(v / (1 - 0.99**2)) + 1e-8)
    np.testing.assert_allclose(p2["w"], want, rtol=1e-12)
    assert state.step == 2


def test_adam_minimises_a_quadratic_and_keeps_dtype():
    cfg = AdamConfig(lr=0.05, warmup=10, clip=1.0)
    p = {"w": np.full(3, 5.0, dtype=np.float32)}
    state = adam_init(p)
    for _ in range(400):
        p, state, _ = adam_update(p, {"w": 2 * p["w"]}, state, cfg)   # d/dw |w|^2
    assert p["w"].dtype == np.float32 and np.max(np.abs(p["w"])) < 0.05


def test_adam_rejects_mismatched_gradients():
    p = {"w": np.zeros(2)}
    with pytest.raises(ValueError, match="do not match"):
        adam_update(p, {"x": np.zeros(2)}, adam_init(p), AdamConfig())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_compiled_adam_is_the_numpy_reference(dtype, clip):
    from linattn.model.fast.optim import adam_update as compiled
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((4, 5)).astype(dtype),
              "b": rng.standard_normal(5).astype(dtype)}
    cfg = AdamConfig(lr=1e-2, warmup=2, clip=clip)
    fast = ref = (params, adam_init(params))
    for step in range(4):                        # the large gradients are clipped
        grads = {n: (rng.standard_normal(a.shape) * (10 if step % 2 else 0.1)).astype(dtype)
                 for n, a in params.items()}
        p, s, norm = compiled(fast[0], grads, fast[1], cfg)
        p_ref, s_ref, norm_ref = adam_update(ref[0], grads, ref[1], cfg)
        np.testing.assert_allclose(norm, norm_ref, rtol=1e-12)
        assert s.step == s_ref.step == step + 1
        for got, want in ((p, p_ref), (s.m, s_ref.m), (s.v, s_ref.v)):
            for n in params:
                assert got[n].dtype == dtype
                # the same operations in the same order; clipping scales by a norm summed
                # in another order, which may differ in its last bit
                np.testing.assert_allclose(got[n], want[n], rtol=0 if clip == 0 else 1e-6)
        fast, ref = (p, s), (p_ref, s_ref)


def test_adam_rejects_gradients_of_other_parameters():
    params = {"w": np.ones(2)}
    with pytest.raises(ValueError, match="do not match"):
        adam_update(params, {"v": np.ones(2)}, adam_init(params), AdamConfig())


def test_compiled_adam_rejects_mismatched_gradients():
    from linattn.model.fast.optim import adam_update as compiled
    p = {"w": np.zeros(2)}
    with pytest.raises(ValueError, match="do not match"):
        compiled(p, {"x": np.zeros(2)}, adam_init(p), AdamConfig())


@pytest.mark.parametrize("path", ["lean", "reference"])
def test_the_path_chooses_the_adam_step(path, monkeypatch):
    """``paths.adam_update`` runs the compiled step on "lean", the NumPy one on
    "reference", and nothing else."""
    from linattn.model import optim, paths
    from linattn.model.fast import optim as fast_optim
    calls = []
    for module, name in ((optim, "reference"), (fast_optim, "lean")):
        real = module.adam_update
        monkeypatch.setattr(module, "adam_update",
                            lambda *a, real=real, name=name: calls.append(name) or real(*a))
    p = {"w": np.ones(3)}
    got, state, _ = paths.adam_update(p, {"w": np.ones(3)}, adam_init(p), AdamConfig(),
                                      path=path)
    assert calls == [path] and state.step == 1 and got["w"].shape == (3,)
    with pytest.raises(ValueError, match="path must be one of lean, reference"):
        paths.adam_update(p, {"w": np.ones(3)}, adam_init(p), AdamConfig(), path="numpy")
