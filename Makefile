# Two commands a new user needs: `make demo` and `make test`. Everything else is in README.md.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean

# constraints.txt pins every transitive version known to install and work together here.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,cloud]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/thrifty run --config examples/digits.yaml

# three workers, a test file each at a time (a module's servers stay its own), the longest files handed out first
# (tests/conftest.py orders them; --no-loadscope-reorder keeps that order); --durations: every run (CI's too) lists
# its slowest tests. Three workers keep 2 cores busy (188 % of 200 % on average, idle here: bench/bench_suite.py);
# a fourth made it slower.
test: $(STAMP)
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=20

clean:
	rm -rf $(VENV) .thrifty
