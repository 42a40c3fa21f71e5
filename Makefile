# Set-up is automatic: the first `make demo` or `make test` creates .venv and installs
# doppler with pinned torch (the CPU build, see constraints.txt) and its dependencies, then
# compiles the bytecode of doppler (an editable install does not) and of its dependencies, so that
# the first command starts as fast as the next (also under PYTHONDONTWRITEBYTECODE, where Python
# never caches what it compiles).
# The dependencies are compiled on every core at once after pip (--no-compile): 22 s instead of
# pip's 36 s one file at a time; like pip, a file that does not compile (torch's Python 3.12 test
# helpers) is skipped.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all fuzz clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet --no-compile --disable-pip-version-check -c constraints.txt -e '.[dev]'
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
	$(PY) -m compileall -q src
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
