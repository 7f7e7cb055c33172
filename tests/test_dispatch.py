"""The one dispatch table: every public function reaches its kernel through
``linattn.dispatch.kernel``, "auto" is resolved there, and bad names are clear errors."""
import importlib
import pathlib
import re

import numpy as np
import pytest

import linattn
from linattn import dispatch


def test_every_table_entry_is_a_module_with_its_familys_functions():
    functions = {"linear": ("attend", "attend_backward", "FUSED_FEATURE_MAPS"),
                 "step": ("step", "step_into", "step_into_compensated",
                          "FUSED_FEATURE_MAPS"),
                 "softmax": ("attend", "attend_backward"),
                 "lsh": ("attend", "attend_backward")}
    for (family, method, backend), name in dispatch.TABLE.items():
        module = importlib.import_module(name)      # CUDA modules import CuPy lazily
        assert method in dispatch.METHODS[family]
        for attribute in functions[family]:
            assert hasattr(module, attribute), (name, attribute)


@pytest.mark.parametrize("causal, want", [(True, "linattn.numba_cpu.chunked"),
                                          (False, "linattn.numba_cpu.chunked")])
def test_auto_is_numba_blocks_on_numpy_arrays(causal, want):
    module, backend = dispatch.kernel("linear", "auto", "auto", np, causal)
    assert (module.__name__, backend) == (want, "numba")


@pytest.mark.parametrize("causal, want", [(True, "linattn.forms.chunked"),
                                          (False, "linattn.forms.cumulative")])
def test_auto_method_on_numpy(causal, want):
    module, backend = dispatch.kernel("linear", "auto", "numpy", np, causal)
    assert (module.__name__, backend) == (want, "numpy")


def test_a_method_numba_lacks_runs_on_numpy_under_auto_and_is_an_error_when_asked(
        monkeypatch):
    # Numba runs every method today: take one away
    table = {key: name for key, name in dispatch.TABLE.items()
             if key != ("linear", "quadratic", "numba")}
    monkeypatch.setattr(dispatch, "TABLE", table)
    module, backend = dispatch.kernel("linear", "quadratic", "auto", np, True)
    assert (module.__name__, backend) == ("linattn.forms.quadratic", "numpy")
    with pytest.raises(ValueError, match="numba"):
        dispatch.kernel("linear", "quadratic", "numba", np, True)


@pytest.mark.parametrize("causal, shape, want", [
    (True, (96, 32), "quadratic"), (True, (97, 32), "chunked"), (True, (127, 32), "chunked"),
    (True, (192, 128), "quadratic"), (True, (193, 128), "chunked"),
    (False, (32, 16), "quadratic"), (False, (33, 16), "chunked"),
    (False, (96, 128), "quadratic"), (False, (97, 128), "chunked"),
    (True, None, "chunked"), (False, None, "chunked")])
def test_auto_on_numba_is_the_kernel_matrix_for_short_sequences(causal, shape, want):
    module, backend = dispatch.kernel("linear", "auto", "numba", np, causal, shape)
    assert (module.__name__, backend) == ("linattn.numba_cpu." + want, "numba")

def test_the_public_function_gives_auto_its_shape(monkeypatch):
    seen = []
    rule = dispatch.AUTO_METHOD["linear", "numba"]
    monkeypatch.setitem(dispatch.AUTO_METHOD, ("linear", "numba"),
                        lambda causal, shape: seen.append(shape) or rule(causal, shape))
    q = k = v = np.ones((2, 5, 3))
    linattn.linear_attention(q, k, v, causal=True)
    linattn.linear_attention_backward(v, q, k, v, causal=True)
    assert seen == [(5, 3), (5, 3)]



def test_every_family_resolves_on_numpy_and_numba():
    for family in ("step", "softmax"):
        for backend in ("numpy", "numba"):
            module, name = dispatch.kernel(family, "auto", backend, np)
            assert name == backend and module.__name__.startswith(
                "linattn.forms" if backend == "numpy" else "linattn.numba_cpu")


@pytest.mark.parametrize("method, backend, match", [("fast", "auto", "unknown method"),
                                                    ("auto", "gpu", "unknown backend"),
                                                    (None, "auto", "unknown method")])
def test_unknown_names(method, backend, match):
    with pytest.raises(ValueError, match=match):
        dispatch.kernel("linear", method, backend, np)


def test_cupy_without_cupy_says_so():
    try:
        import cupy  # noqa: F401  (only whether it imports)
    except ImportError:
        with pytest.raises(ImportError, match="CuPy"):
            dispatch.kernel("linear", "auto", "cupy", np)
    else:
        pytest.skip("CuPy is installed: tests/test_cuda.py covers it")


def test_numba_is_resolved_nowhere_else():
    """No module but dispatch picks a backend: the old resolvers are gone, and no public
    module imports a backend package directly."""
    root = pathlib.Path(linattn.__file__).parent
    for path in root.glob("*.py"):
        text = path.read_text()
        if path.name == "dispatch.py":
            continue
        assert "resolve_backend" not in text and "wants_cupy" not in text, path.name
        assert not re.search(r"from \.(numba_cpu|cuda)\b", text), path.name


def test_auto_is_numpy_when_numba_does_not_import(monkeypatch):
    monkeypatch.setattr(dispatch, "numba_imports", lambda: False)
    module, backend = dispatch.kernel("linear", "auto", "auto", np, True)
    assert (module.__name__, backend) == ("linattn.forms.chunked", "numpy")
    q = k = v = np.ones((5, 3))
    with pytest.raises(ValueError, match="needs the numba package"):
        linattn.linear_attention(q, k, v, backend="numba")
