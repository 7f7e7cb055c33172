"""The README and the docs tell the truth: every Python example in them runs as written."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_has_an_example():
    assert python_blocks(ROOT / "README.md"), "README.md has no python example"


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_examples_run(path):
    for block in python_blocks(path):
        exec(compile(block, str(path), "exec"), {})
