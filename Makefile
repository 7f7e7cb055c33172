# Two commands do all the set-up on a fresh machine; each creates .venv when it is missing.
#   make figures   the main job: regenerates figures/ from fresh measurements and
#                  re-executes the notebooks in place; PEER_PYTHON=/path/to/python (an
#                  interpreter with torch and pytorch-fast-transformers) draws the peers too
#   make test      the test suite (the 15 slowest tests listed at the end)
#   make paper     optional, hours: the paper's experiments at the paper's proportions
#                  (copy task at 128 positions, Table 1 on images, Table 3 on speech of
#                  about 800 frames) into figures/paper, the same figure and CSV names (and image_table), the CSVs saying
#                  "# tier: paper"; resumable: rerun it after a stop and it skips the
#                  finished models (into figures/paper, runs in figures/paper/paper_runs)
#   make lint      ruff over the package, the tests and the notebooks' Python files
#   make student   student/: the notebooks with the exercises unanswered, and their checks
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PEER_PYTHON ?=

.PHONY: figures paper notebooks test lint student

$(VENV)/installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,notebooks,digits]'
	touch $@

# the notebooks after the figures: notebook 10 reads figures/speech_table.csv and its figure
figures: $(VENV)/installed
	$(PY) -m linattn.lab.figures $(if $(PEER_PYTHON),--peer-python $(PEER_PYTHON))
	$(MAKE) --no-print-directory notebooks

paper: $(VENV)/installed
	$(PY) -m linattn.lab.paper

notebooks: $(VENV)/installed
	$(PY) -m jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb

test: $(VENV)/installed
	$(PY) -m pytest -q --durations=15

$(VENV)/lint-installed: $(VENV)/installed
	$(PY) -m pip install --quiet -e '.[lint]'
	touch $@

lint: $(VENV)/lint-installed
	$(PY) -m ruff check linattn tests notebooks/checks notebooks/solutions

student: $(VENV)/installed
	$(PY) notebooks/student.py student
