"""The package's shape, checked from its source: the library never reaches the lab, only the
dispatch table (and an explicit allow-list) reaches a backend, and importing the library
changes nothing in the process."""
import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "linattn"

# modules that may import a backend package (numba_cpu, cuda, numba, cupy) directly, with
# the reason; every other module goes through ``linattn.dispatch``
BACKEND_ALLOWED = {
    "linattn.dispatch": "the one table",
    "linattn._checks": "recognises CuPy arrays",
    "linattn.model.fast.fused": "training's element loops (GELU, layer norm, heads, "
                                "embedding): no attention kernel, Numba-only by design",
    "linattn.model.fast.optim": "Adam's update as one compiled pass: Numba-only by design",
    "linattn.model.fast.token_kernels": "a generated token's element work and split "
                                        "products: Numba-only by design",
    "linattn.model.fast.rnn_token": "a whole generated token as one compiled call, calling "
                                    "the Numba RNN step inside it: Numba-only by design",
}
BACKEND_PACKAGES = ("linattn.numba_cpu", "linattn.cuda", "numba", "cupy")


def _module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imports_of(path):
    """Every module ``path`` imports, anywhere in it (functions too), as absolute names."""
    name, is_package = _module_name(path)
    package = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def library_modules():
    for path in sorted(ROOT.rglob("*.py")):
        name, _ = _module_name(path)
        if name.startswith("linattn.lab") or name == "linattn.__main__":
            continue
        yield name, path


def _reaches(imports, packages):
    return sorted(m for m in imports for p in packages if m == p or m.startswith(p + "."))


def test_the_walker_sees_relative_and_nested_imports(tmp_path):
    """A test that cannot fail is a defect: the walker must find an import inside a function."""
    path = ROOT / "model" / "cli.py"
    assert "linattn.model.train" in imports_of(path)
    assert any(m.startswith("linattn.model.speech") for m in imports_of(path))  # nested


@pytest.mark.parametrize("name, path", list(library_modules()), ids=lambda x: str(x))
def test_the_library_never_imports_the_lab(name, path):
    assert not _reaches(imports_of(path), ("linattn.lab",)), name


@pytest.mark.parametrize("name, path", list(library_modules()), ids=lambda x: str(x))
def test_only_dispatch_reaches_a_backend(name, path):
    """Backend packages import their own modules; anyone else goes through the table."""
    if name in BACKEND_ALLOWED or name.startswith(("linattn.numba_cpu", "linattn.cuda")):
        return
    assert not _reaches(imports_of(path), BACKEND_PACKAGES), name


# the reference model a student reads: none of it may reach the compiled path, which only
# ``linattn.model.paths`` chooses
REFERENCE = ("linattn.model.layers", "linattn.model.attention", "linattn.model.transformer",
             "linattn.model.optim", "linattn.model.token_step", "linattn.model.prefill",
             "linattn.model.variants")
FAST = "linattn.model.fast"


@pytest.mark.parametrize("name", REFERENCE)
def test_the_reference_model_never_imports_the_compiled_path(name):
    path = dict(library_modules())[name]
    assert not _reaches(imports_of(path), (FAST,)), name


def test_only_the_paths_module_chooses_the_compiled_path():
    """Outside ``model.fast`` itself, one module imports it: ``model.paths``."""
    importers = {name for name, path in library_modules()
                 if not name.startswith(FAST) and _reaches(imports_of(path), (FAST,))}
    assert importers == {"linattn.model.paths"}


def test_the_allow_list_names_real_modules():
    names = {name for name, _ in library_modules()}
    assert set(BACKEND_ALLOWED) <= names


def _fresh(code):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT",
                        "LINATTN_THREADS_ADDED")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=True).stdout


def test_import_changes_no_environment_and_loads_no_lab():
    out = _fresh("import os, sys; before = dict(os.environ)\n"
                 "import linattn, linattn.model, linattn.threads\n"
                 "print(dict(os.environ) == before, "
                 "any(m.startswith('linattn.lab') for m in sys.modules))")
    assert out.split() == ["True", "False"]


def test_training_leaves_the_allocator_alone_unless_asked(monkeypatch, tmp_path):
    """``run`` calls ``threads.keep_freed_memory`` only with ``keep_freed_memory=True``."""
    from linattn import threads
    from linattn.model import TrainConfig, run
    from linattn.model.train import copy_setup
    calls = []
    monkeypatch.setattr(threads, "keep_freed_memory", lambda: calls.append(1) or True)
    task, cfg = copy_setup("linear", length=3)
    cfg = cfg._replace(d_model=8, n_heads=2, n_layers=1, d_mlp=16)
    train_cfg = TrainConfig(steps=1, batch_size=2, eval_every=1, checkpoint_every=1)
    run(cfg, task, train_cfg)
    assert calls == []
    run(cfg, task, train_cfg, keep_freed_memory=True)
    assert calls == [1]
