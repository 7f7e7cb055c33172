# Two commands do all the set-up on a fresh machine; each creates .venv when it is missing.
#   make figures   the main job: regenerates figures/ from fresh measurements
#   make test      the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: figures test demo

$(VENV)/installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,notebooks]'
	touch $@

figures: $(VENV)/installed
	$(PY) -m linattn demo

test: $(VENV)/installed
	$(PY) -m pytest -q
