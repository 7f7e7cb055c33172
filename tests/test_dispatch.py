"""The one dispatch table: every public function reaches its kernel through
``linattn.dispatch.kernel``, "auto" is resolved there, each backend module declares the
options it supports, and bad names are clear errors."""
import importlib
import pathlib
import types

import numpy as np
import pytest

import linattn
from linattn import dispatch
from linattn.forms import chunked as numpy_chunked, recurrent as numpy_recurrent

from test_layout import BACKEND_ALLOWED, imports_of

# stands in for the cupy module: "auto" on CuPy arrays asks for nothing else of it
FAKE_CUPY = types.SimpleNamespace(__name__="cupy")


def modules_of(entry):
    """The module names of a table entry: one name, or a tuple tried in order."""
    return (entry,) if isinstance(entry, str) else entry


def test_every_table_entry_is_a_module_with_its_familys_functions():
    functions = {"linear": ("attend", "attend_backward", "FUSED_FEATURE_MAPS"),
                 "step": ("step", "step_into", "step_into_compensated",
                          "FUSED_FEATURE_MAPS"),
                 "softmax": ("attend", "attend_backward"),
                 "lsh": ("attend", "attend_backward"),
                 "delta": ("attend", "attend_backward", "step", "FUSED_FEATURE_MAPS")}
    for (family, method, backend), entry in dispatch.TABLE.items():
        assert method in dispatch.METHODS[family]
        for name in modules_of(entry):
            module = importlib.import_module(name)      # CUDA modules import CuPy lazily
            for attribute in functions[family]:
                assert hasattr(module, attribute), (name, attribute)


def test_every_module_declares_the_options_it_supports():
    names = {name for entry in dispatch.TABLE.values() for name in modules_of(entry)}
    for name in sorted(names):
        supports = importlib.import_module(name).SUPPORTS
        assert isinstance(supports, frozenset), name
        assert supports <= set(dispatch.OPTIONS), (name, supports - set(dispatch.OPTIONS))
    # the step family has no options; every NumPy form runs non-causal attention
    assert importlib.import_module("linattn.forms.recurrent").SUPPORTS >= {"non_causal"}
    assert all(importlib.import_module(m).SUPPORTS == frozenset()
               for m in ("linattn.numba_cpu.step", "linattn.cuda.step"))


def test_each_module_of_a_chain_takes_more_than_the_one_before():
    """A module later in a tuple entry runs only calls that those before it cannot: it must
    support strictly more options, or it is never reached."""
    for entry in dispatch.TABLE.values():
        if isinstance(entry, tuple):
            supports = [importlib.import_module(m).SUPPORTS for m in entry]
            assert all(a < b for a, b in zip(supports, supports[1:])), entry


@pytest.mark.parametrize("option, value", [("key_mask", np.ones(3, bool)), ("key_mask", None),
                                           ("initial_state", None), ("return_state", True),
                                           ("return_state", False)])
def test_needed_names_the_options_given(option, value):
    want = {"non_causal"} | ({option} if value is not None and value is not False else set())
    assert dispatch.needed(causal=False, **{option: value}) == want
    assert dispatch.needed(causal=True) == frozenset()


def test_auto_skips_a_module_without_an_option_and_a_named_backend_says_which(monkeypatch):
    # Numba's blocks and loops declared without the key mask (as before they had it),
    # NumPy's blocks with it: take it from NumPy's; the recurrent form nowhere
    assert "key_mask" in numpy_chunked.SUPPORTS
    monkeypatch.setattr(numpy_recurrent, "SUPPORTS", frozenset({"non_causal"}))
    monkeypatch.setattr(importlib.import_module("linattn.forms.decay_recurrent"), "SUPPORTS",
                        frozenset({"non_causal"}))       # the gated running sums after it
    for name in ("chunked", "loops", "decay_loops"):
        monkeypatch.setattr(importlib.import_module(f"linattn.numba_cpu.{name}"), "SUPPORTS",
                            frozenset({"non_causal"}))
    needs = dispatch.needed(causal=True, key_mask=True)
    module, backend = dispatch.kernel("linear", "chunked", "auto", np, True, needs=needs)
    assert (module.__name__, backend) == ("linattn.forms.chunked", "numpy")
    module, backend = dispatch.kernel("linear", "auto", "auto", np, True, (200, 8), needs)
    assert (module.__name__, backend) == ("linattn.forms.chunked", "numpy")
    with pytest.raises(ValueError, match="'numba'.*'chunked'.*key_mask"):
        dispatch.kernel("linear", "chunked", "numba", np, True, needs=needs)
    with pytest.raises(ValueError, match="'recurrent' with key_mask"):
        dispatch.kernel("linear", "recurrent", "auto", np, True, needs=needs)


@pytest.mark.parametrize("option", sorted(dispatch.GATED))
@pytest.mark.parametrize("shape", [(8, 16), (4096, 64), None])
def test_auto_runs_a_gate_on_numbas_compiled_loops(option, shape):
    # without the option the same call takes the blocks; with it, Numba's gated loops
    needs = dispatch.needed(causal=True, **{option: True})
    plain, _ = dispatch.kernel("linear", "auto", "auto", np, True, shape)
    gated, backend = dispatch.kernel("linear", "auto", "auto", np, True, shape, needs)
    assert plain.__name__ != "linattn.numba_cpu.decay_loops"
    assert (gated.__name__, backend) == ("linattn.numba_cpu.decay_loops", "numba")


@pytest.mark.parametrize("method, causal, want", [
    ("linear", True, "linattn.cuda.cumulative"), ("linear", False, "linattn.forms.cumulative"),
    ("recurrent", False, "linattn.forms.cumulative"), ("chunked", True, "linattn.cuda.chunked"),
    ("chunked", False, "linattn.forms.chunked"), ("auto", False, "linattn.forms.cumulative"),
    ("auto", True, "linattn.cuda.chunked")])
def test_non_causal_cupy_calls_take_the_tables_route_to_numpys_forms(method, causal, want):
    needs = dispatch.needed(causal=causal)
    module, backend = dispatch.kernel("linear", method, "auto", FAKE_CUPY, causal, needs=needs)
    assert (module.__name__, backend) == (want, "cupy")


@pytest.mark.parametrize("name", ["linattn.cuda.cumulative", "linattn.cuda.chunked"])
def test_a_causal_only_kernel_refuses_a_non_causal_call(name):
    """What a module does not declare it does not do silently: no reroute inside."""
    module = importlib.import_module(name)
    assert "non_causal" not in module.SUPPORTS
    x = np.ones((1, 2, 2))
    with pytest.raises(ValueError, match="causal only"):
        module.attend_backward(x, x, x, x, causal=False, eps=1e-6)


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
                        lambda causal, shape, needs: (seen.append(shape)
                                                      or rule(causal, shape, needs)))
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
    """No module of the package, at any depth, picks a backend but dispatch: none reads the
    table, the "auto" rule or the declarations, and none outside the backends, the lab and the
    allow-list of tests/test_layout.py imports a backend."""
    root = pathlib.Path(linattn.__file__).parent
    paths = sorted(root.rglob("*.py"))
    assert root / "model" / "fast" / "token_loop.py" in paths          # the walk goes down
    for path in paths:
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        if name == "linattn.dispatch" or name.startswith(("linattn.numba_cpu", "linattn.cuda")):
            continue
        text = path.read_text()
        if name == "linattn.lab.page_rules":   # describes the "auto" rule, picks nothing
            text = text.replace("AUTO_METHOD", "")
        for word in ("resolve_backend", "wants_cupy", "TABLE[", "AUTO_METHOD", "_candidates",
                     ".SUPPORTS", ".FUSED_FEATURE_MAPS"):
            assert word not in text, (name, word)
        if name not in BACKEND_ALLOWED and not name.startswith("linattn.lab"):  # it measures them
            assert not any(m.startswith(("linattn.numba_cpu", "linattn.cuda", "numba", "cupy"))
                           for m in imports_of(path)), name


def test_auto_is_numpy_when_numba_does_not_import(monkeypatch):
    monkeypatch.setattr(dispatch, "numba_imports", lambda: False)
    module, backend = dispatch.kernel("linear", "auto", "auto", np, True)
    assert (module.__name__, backend) == ("linattn.forms.chunked", "numpy")
    q = k = v = np.ones((5, 3))
    with pytest.raises(ValueError, match="needs the numba package"):
        linattn.linear_attention(q, k, v, backend="numba")
