# Set-up is automatic: the first `make demo` or `make test` creates .venv and installs
# doppler with pinned torch (the CPU build, see constraints.txt) and its dependencies.
# Bytecode: Python caches each module's bytecode as it first imports it, and every command that make
# runs keeps that default even where the environment sets PYTHONDONTWRITEBYTECODE (under which
# every process would compile every module it imports, again and again). The first command
# compiles what it imports, once; the next ones start from the cache. pip compiles nothing
# (--no-compile): the dependencies hold 14,700 Python files, most never imported (transformers'
# 2,900, sympy's 1,500), and compiling them all up front costs more than compiling, on first
# import, the ones that are used.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONDONTWRITEBYTECODE :=

.PHONY: demo test test-all fuzz clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet --no-compile --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/doppler demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not slow"

# Everything `make test` runs, plus the whole scenarios marked `slow` (the four-workload demo, a 58 M-parameter
# LLaMA run with its weights): each of their properties is also checked at a small size by `make test`.
test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal

# The long run of the fuzzing suite (docs/fuzzing.md): FUZZ_EXAMPLES random examples per fuzz test (a costly
# one takes a share of them) instead of `make test`'s short run.
FUZZ_EXAMPLES ?= 1000
fuzz: $(STAMP)
	DOPPLER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -n 2 tests/fuzz tests/importer/test_pt2.py::test_fuzz_a_mutated_archive_imports_or_fails_in_one_line --hypothesis-show-statistics

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
	find src -name '*.nbi' -delete -o -name '*.nbc' -delete
