"""Write a student copy of the notebooks: the exercises without their answers.

    python notebooks/student.py OUTDIR        (make student writes student/)

OUTDIR gets every notebook with the outputs of its ``exercise``-tagged cells cleared (the
stub and its check stay, unrun), and ``checks/``; ``solutions/`` is left out. The copy runs
as it is: from OUTDIR, each exercise cell prints "not attempted yet" until it is written.
The convention is in ``checks/__init__.py``.
"""
import argparse
import pathlib
import shutil

import nbformat

NOTEBOOKS = pathlib.Path(__file__).resolve().parent


def is_exercise(cell):
    return cell.cell_type == "code" and "exercise" in cell.metadata.get("tags", [])


def student_notebook(path):
    """The notebook at ``path`` with its exercise cells' outputs cleared."""
    nb = nbformat.read(path, as_version=4)
    for cell in filter(is_exercise, nb.cells):
        cell.outputs, cell.execution_count = [], None
    return nb


def write(out):
    """Write the student copy into ``out`` (created; an existing copy is replaced)."""
    out = pathlib.Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nbformat.write(student_notebook(path), out / path.name)
    shutil.copytree(NOTEBOOKS / "checks", out / "checks",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(NOTEBOOKS.parent / "figures", out / "figures")   # what notebook 10 shows
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", help="where to write the copy (replaced if it exists)")
    out = write(parser.parse_args(argv).outdir)
    print(f"student copy in {out}: {len(list(out.glob('*.ipynb')))} notebooks and checks/, "
          "no solutions/")


if __name__ == "__main__":
    main()
