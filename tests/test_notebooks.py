"""Every notebook runs top to bottom from a clean kernel, and is committed with its outputs.

The notebooks read ``LINATTN_QUICK=1`` to shrink their measurements (the derivations on tiny
arrays are the same), and write their figures under ``LINATTN_NOTEBOOK_OUT``.
"""
import pathlib

import pytest

from helpers import CELL_TIMEOUT_S

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_from_a_clean_kernel(path, tmp_path, monkeypatch):
    monkeypatch.setenv("LINATTN_QUICK", "1")
    monkeypatch.setenv("LINATTN_NOTEBOOK_OUT", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    assert any(tmp_path.glob("*.png")) or "figures." not in path.read_text()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_with_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count is not None for cell in code), path.name
    assert not any(out.output_type == "error" for cell in code for out in cell.outputs)
