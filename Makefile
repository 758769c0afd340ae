# Makefile -- the developer's entry: a thin front over pip (setup.py) and allocators/build.py.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
NATIVE := build/native

.PHONY: all install native test demo bench bench-deps asan clean readme-settings

all: install

# The virtualenv with the test/bench extras (tensorflow-cpu 2.21, pytest, pyperf); redone when pyproject changes.
$(VENV)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip "setuptools>=77" wheel
	$(PIP) install -q ".[test]"
	touch $@

# Reinstall rtkit itself (fast: no dependency resolution); builds both native libraries through setup.py.
install: $(VENV)/.deps
	$(PIP) install -q --no-deps --no-build-isolation --force-reinstall .

# Native libraries and the C test programs, for the C tests (same script setup.py uses).
native: $(VENV)/.deps
	$(PY) allocators/build.py --tests --out $(NATIVE)

# pytest runs from build/ so that `python -c`/`-m` children import the installed rtkit, not the source folder
# (the source tree alone lacks rtkit.allocators and rtkit.scheduler, which live in other top-level folders).
test: install native
	cd build && RTKIT_NATIVE_DIR=$(abspath $(NATIVE)) $(abspath $(VENV))/bin/pytest $(abspath tests)

demo: install
	$(VENV)/bin/rtkit demo

bench: install
	$(VENV)/bin/rtkit bench --workload wdl --configs tf-default,glibc,jemalloc,tcmalloc,mimalloc,tf-bfc,rtkit --rounds 3

# Peer allocators for `rtkit bench` and the allocator benchmarks (Debian packages; needs root).
bench-deps:
	apt-get update
	apt-get install -y libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 libmemkind0 libpmemobj1 libpmemobj-dev libpmem-dev valgrind

asan:
	$(PYTHON) allocators/build.py --tests --asan --out build/native-asan

clean:
	rm -rf build dist *.egg-info $(VENV)

# Regenerate the README's settings table from rtkit/config.py (tests/test_config.py checks it is current).
readme-settings:
	$(PYTHON) -c "import re, sys; sys.path.insert(0, '.'); from rtkit.config import doc_table; p = 'README.md'; t = open(p).read(); open(p, 'w').write(re.sub(r'<!-- settings:begin -->\n.*?\n<!-- settings:end -->', lambda m: '<!-- settings:begin -->\n' + doc_table() + '\n<!-- settings:end -->', t, flags=re.S))"
