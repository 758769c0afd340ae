# Makefile -- the developer's entry: a thin front over pip (pyproject.toml + setup.py's build hook) and allocators/build.py.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PYTEST_ARGS ?=  # e.g. make test PYTEST_ARGS="tests/test_pmem.py -x"

.PHONY: all install native test test-fast compat demo bench bench-deps browser-deps asan clean readme-settings

all: install

# The virtualenv with the test/bench extras (tensorflow-cpu 2.21, pytest, pyperf); redone when the packaging changes.
# rtkit itself is installed editable (see install), so no copy of it ever lands in site-packages.
$(VENV)/.deps: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip "setuptools>=77" wheel
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -q -e ".[test]"
	touch $@

# Editable install (fast: no dependency resolution): rtkit, rtkit.scheduler, rtkit.allocators and rtkit.profiles
# import from rtkit/, scheduler/, allocators/python/ and profiles/ (pyproject's package-dir), so Python edits
# take effect without reinstalling. Also rebuilds both native libraries into allocators/python/, where the
# bindings load them from (setup.py's build hook); after a C edit, `make native` alone is enough.
# (setuptools' warning that ./rtkit may take precedence is silenced: ./rtkit is the very folder it maps.)
install: $(VENV)/.deps
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -q --no-deps --no-build-isolation -e .

# Both native libraries into allocators/python/ (the same script the install hook runs).
native: $(VENV)/.deps
	$(PY) allocators/build.py

# The whole suite, from the repository root (this is what .ci/run calls). The C test programs are built by the
# tests themselves into build/native/. Exit 5 (no tests collected, e.g. all deselected) is not a failure.
test: install
	$(VENV)/bin/pytest $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The fast subset (no TensorFlow runs, no wheel build): about two minutes on 2 cores.
test-fast: install
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The hook and step tests against each TensorFlow release users run: one venv per version under $(COMPAT_DIR)
# (kept, so a rerun only runs the tests), rtkit installed editable into each. Not part of `make test`: CI keeps
# the newest, which .venv already holds. A version's failures do not stop the others; the last line names them.
# Releases before the newest get COMPAT_OLD_PINS: 2.20 lets pip pair it with protobuf 7, which it does not run
# with (MonitoredTrainingSession's graph write fails in text_format, rtkit or not); 2.19 bounds protobuf itself.
# e.g. make compat COMPAT_TF="2.20 2.19"
COMPAT_TF       ?= 2.21 2.20 2.19
COMPAT_NEWEST   ?= 2.21
COMPAT_OLD_PINS ?= protobuf<7
COMPAT_DIR      ?= build/compat
COMPAT_TESTS    ?= tests/test_hooks_tf.py $(wildcard tests/test_steps*.py)
compat:
	@failed=""; for v in $(COMPAT_TF); do \
	  env="$(COMPAT_DIR)/tf-$$v"; echo "== tensorflow-cpu $$v ($$env)"; \
	  if [ ! -f "$$env/.deps" ]; then \
	    $(PYTHON) -m venv "$$env" && \
	    "$$env/bin/python" -m pip install -q --upgrade pip "setuptools>=77" wheel "cffi>=1.15" && \
	    "$$env/bin/python" -m pip install -q "tensorflow-cpu==$$v.*" "pytest>=7" "pytest-timeout>=2.1" && \
	    touch "$$env/.deps" || { failed="$$failed $$v(install)"; continue; }; \
	  fi; \
	  if [ "$$v" != "$(COMPAT_NEWEST)" ]; then "$$env/bin/python" -m pip install -q "$(COMPAT_OLD_PINS)" \
	    || { failed="$$failed $$v(install)"; continue; }; fi; \
	  PYTHONWARNINGS="ignore:Editable installation" "$$env/bin/python" -m pip install -q --no-build-isolation -e . \
	    || { failed="$$failed $$v(install)"; continue; }; \
	  "$$env/bin/python" -c "import tensorflow as tf; print('tensorflow', tf.__version__)" 2>/dev/null; \
	  "$$env/bin/pytest" -q -p no:cacheprovider $(COMPAT_TESTS) $(PYTEST_ARGS) || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "compat: failed on$$failed"; exit 1; fi; echo "compat: passed on $(COMPAT_TF)"

demo: install
	$(VENV)/bin/rtkit demo

bench: install
	$(VENV)/bin/rtkit bench --workload wdl --configs tf-default,glibc,jemalloc,tcmalloc,mimalloc,tf-bfc,rtkit --rounds 3

# Peer allocators for `rtkit bench` and the allocator benchmarks (Debian packages; needs root).
bench-deps:
	apt-get update
	apt-get install -y libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 libmemkind0 libpmemobj1 libpmemobj-dev libpmem-dev valgrind

# Headless Chromium for the HTML report's browser test (tests/test_report_browser.py installs it the same way when
# it runs as root; elsewhere that test skips and says why). Debian's package; needs root and the network.
browser-deps:
	command -v chromium >/dev/null 2>&1 || { apt-get update && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }

asan:
	$(PYTHON) allocators/build.py --tests --asan --out build/native-asan

clean:
	rm -rf build dist *.egg-info $(VENV) allocators/python/librtkit_*

# Regenerate the README's settings table from rtkit/config.py (tests/test_config.py checks it is current).
readme-settings:
	$(PYTHON) -c "import re, sys; sys.path.insert(0, '.'); from rtkit.config import doc_table; p = 'README.md'; t = open(p).read(); open(p, 'w').write(re.sub(r'<!-- settings:begin -->\n.*?\n<!-- settings:end -->', lambda m: '<!-- settings:begin -->\n' + doc_table() + '\n<!-- settings:end -->', t, flags=re.S))"
