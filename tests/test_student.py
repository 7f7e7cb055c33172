"""The student copy (``notebooks/student.py``): the notebooks with their exercise cells'
outputs cleared and checks/, without solutions/; every notebook of it runs from a clean
kernel, and every exercise cell says "not attempted yet"."""
import importlib.util
import pathlib

import pytest

from helpers import CELL_TIMEOUT_S

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
NAMES = sorted(path.name for path in NOTEBOOKS.glob("*.ipynb"))


def builder():
    spec = importlib.util.spec_from_file_location("student", NOTEBOOKS / "student.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    return builder().write(tmp_path_factory.mktemp("student") / "notebooks")


def exercise_cells(nb):
    return [cell for cell in nb.cells
            if cell.cell_type == "code" and "exercise" in cell.metadata.get("tags", [])]


def test_copy_holds_notebooks_and_checks_and_no_solutions(copy):
    assert sorted(path.name for path in copy.glob("*.ipynb")) == NAMES
    assert (copy / "checks" / "__init__.py").exists()
    assert (copy / "checks" / "_exercises.py").exists()
    assert not (copy / "solutions").exists()
    assert not any("solutions" in path.parts for path in copy.rglob("*"))


def test_exercise_cells_are_cleared_and_the_rest_kept(copy):
    for name in NAMES:
        original = nbformat.read(NOTEBOOKS / name, as_version=4)
        student = nbformat.read(copy / name, as_version=4)
        assert [c.source for c in student.cells] == [c.source for c in original.cells]
        for cell in exercise_cells(student):
            assert cell.outputs == [] and cell.execution_count is None, name
        kept = [c for c in student.cells if c.cell_type == "code" and c not in
                exercise_cells(student)]
        assert all(c.execution_count is not None for c in kept), name


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_student_notebook_runs_with_every_exercise_not_attempted(name, copy, tmp_path,
                                                                 monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("LINATTN_QUICK", "1")
    monkeypatch.setenv("LINATTN_NOTEBOOK_OUT", str(tmp_path))
    nb = nbformat.read(copy / name, as_version=4)
    if not exercise_cells(nb):
        pytest.skip(f"{name} has no exercise cells yet")
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(copy)}}).execute()
    for cell in exercise_cells(nb):
        text = "".join(out.get("text", "") for out in cell.outputs)
        assert "not attempted yet" in text, (name, cell.source[-80:], text)
