# searchrl: `make test` and `make demo` work on a fresh machine: they build .venv from the requirements
# files first, and rebuild it whenever one of them changes. `make demo` installs the runtime alone
# (requirements.txt and searchrl); `make install` adds the tests' packages.
PYTHON ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime
STAMP   := $(VENV)/.installed
# PyTorch's CPU builds: requirements-test.txt pins torch's `+cpu` wheel, which lives there (or in a folder
# pip's find-links names); asked for torch alone, without retries, so that a host that cannot reach it
# loses no time.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

# JAX on CPU; the tests add 8 fake devices (tests/conftest.py), so sharded code paths are really exercised.
export JAX_PLATFORMS ?= cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

LIBTPU := .libtpu/libtpu/libtpu.so

.PHONY: install lucene libtpu aot-gpu test test-fast demo smoke reproduce clean-venv

install: $(STAMP)

# The optional Lucene backend alone (Java 17+ on PATH), for a venv that `make install` built without Java.
lucene: $(RUNTIME)
	@command -v java >/dev/null || { echo "the Lucene backend needs Java 17+ on PATH (or JAVA_HOME)"; exit 1; }
	$(PY) -m pip install --quiet -r requirements-lucene.txt
	$(PY) -m pip install --quiet --no-deps pyserini==0.22.1

# libtpu outside the venv, for ahead-of-time TPU compilation on this host (searchrl.benchmarks.aot).
libtpu: $(LIBTPU)

$(LIBTPU): requirements-libtpu.txt $(STAMP)
	rm -rf .libtpu
	$(PY) -m pip install --quiet --no-deps --target .libtpu -r requirements-libtpu.txt
	touch $(LIBTPU)

# A second venv with JAX's CUDA plugin (5.7 GB; no GPU or driver needed), for ahead-of-time GPU compilation
# on this host: `.venv-gpu/bin/python -m searchrl.benchmarks.aot --topology a100:8 ...`.
aot-gpu: .venv-gpu/.installed

.venv-gpu/.installed: requirements.txt requirements-gpu.txt pyproject.toml
	test -x .venv-gpu/bin/python || $(PYTHON) -m venv .venv-gpu
	.venv-gpu/bin/python -m pip install --quiet -r requirements.txt "$$(grep '^jax\[cuda12\]' requirements-gpu.txt)"
	.venv-gpu/bin/python -m pip install --quiet --no-deps -e .
	touch $@

$(RUNTIME): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME) requirements-test.txt requirements-lucene.txt
	grep '^torch' requirements-test.txt \
	  | $(PY) -m pip install --quiet --no-deps --retries 0 --extra-index-url $(TORCH_INDEX) -r /dev/stdin
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-test.txt
	@# Lucene (pyserini) is optional and needs Java 17+: installed when `java` is on PATH, else skipped
	@# (never apt-get: that needs root).
	@if command -v java >/dev/null; then \
	  $(PY) -m pip install --quiet -r requirements-lucene.txt && \
	  $(PY) -m pip install --quiet --no-deps pyserini==0.22.1; \
	else \
	  echo "note: no java on PATH: skipped the optional Lucene backend (with Java 17+: make lucene)"; \
	fi
	touch $(STAMP)

test: install libtpu
	$(PY) -m pytest -q -n 2 --dist loadfile tests

test-fast: install libtpu
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow" tests

# The demo trains on one CPU device (the tests' 8 fake devices would only add overhead on 2 cores); it
# needs the runtime only.
demo: $(RUNTIME)
	XLA_FLAGS= $(PY) -m searchrl.demo --config configs/autosearch.py:tiny

# Each paper's miniature end to end at its smallest (configs/*.py:smoke): runs/smoke/<paper>.
smoke: install
	XLA_FLAGS= $(PY) -m searchrl.demo --size smoke

# The three miniatures over 5 seeds and each paper's claims checked on them (runs/reproduce/claims.json);
# `python -m searchrl.demo.publish --claims runs/reproduce/claims.json` then regenerates the figures.
reproduce: $(RUNTIME)
	XLA_FLAGS= $(PY) -m searchrl.demo.reproduce

clean-venv:
	rm -rf $(VENV)
