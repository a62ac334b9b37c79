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

# two workers, a test file each at a time (a module's servers stay its own); --durations: every run (CI's too) lists
# its slowest tests. The suite mostly waits on servers and training nodes, so two workers fit 2 cores.
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --durations=20

clean:
	rm -rf $(VENV) .thrifty
