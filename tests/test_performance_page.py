"""The performance page is built from the committed measurements alone: it names the machine
and the date, and has a table for each measurement the run made."""
import pathlib

from linattn.lab import performance_page
from linattn.lab.figures import read_csv

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"


def test_page_from_committed_figures(tmp_path):
    page = performance_page.write_page(FIGURES, tmp_path / "performance.md").read_text()
    _, meta = read_csv(FIGURES / "time_vs_n.csv")
    cpu = meta["caption"].split(" on ", 1)[1].split(",")[0]          # the CPU the run named
    assert cpu in page
    assert meta["date"] in page
    for title in ("Head to head", "Time against N", "Peak memory", "One generated token",
                  "Generating images", "Copy task", "Speech, synthetic task",
                  "Associative retrieval", "Thread settings", 'method "auto"'):
        assert f"## {title}" in page or title in page, title
    assert "| curve | N = 512 |" in page                              # the time and memory tables
    assert "| causal linear (Numba) |" in page
    assert "BLAS:" in page and "Numba" in page
    assert "| delta numba chunked | 8 | 64 | 4096 |" in page          # the auto rules' timings
    assert "| pairs P | softmax | linear | decay | delta |" in page    # the retrieval table


def test_committed_page_is_current(tmp_path):
    """docs/performance.md is what the committed figures give: regenerate it with
    ``python -m linattn.lab.performance_page`` after ``make figures``."""
    page = performance_page.write_page(FIGURES, tmp_path / "performance.md").read_text()
    assert (ROOT / "docs" / "performance.md").read_text() == page


def test_missing_files_are_said(tmp_path):
    page = performance_page.write_page(tmp_path, tmp_path / "out.md").read_text()
    assert "Not in this run" in page
    assert "## Thread settings" in page


def test_page_path():
    assert performance_page.page_path("figures") == pathlib.Path("docs/performance.md")
    assert performance_page.page_path("/tmp/x") == pathlib.Path("/tmp/x/performance.md")
