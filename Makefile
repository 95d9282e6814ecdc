# Two commands on a fresh machine: `make demo` and `make test`.
# `make check` is the second tier on top: `make test`, the slow-by-nature tests and `make compat`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install demo test check tier2 lint docs clean compat

# DeepSpeed (tests only: the sharded-engine scenarios, tests/sharded.py) is a source distribution
# whose build imports torch: installed after torch, without build isolation (so with the pinned
# setuptools, able to build a wheel on its own) and without compiled ops (DS_BUILD_OPS=0).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[all,dev]'
	$(PY) -m pip install -q -c constraints.txt setuptools
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation -c constraints.txt deepspeed
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(PY) -m ruff check hf_callbacks_plus tests examples benchmarks scripts

# pytest-xdist: one worker per core (PYTEST_WORKERS=0: one process); tests sharing a session
# service (the mlflow server, the torchrun launch) run on one worker (tests/conftest.py), so each
# service starts once.
PYTEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup

test: $(STAMP) lint docs
	$(PYTEST)

# The second tier (tests marked second_tier: the default-size demo, the launcher and transformers
# version matrices), then every supported transformers. `make test check` runs `test` once.
tier2: $(STAMP)
	$(PYTEST) --tier 2

check: test tier2 compat

# The documentation site (mkdocs material + mkdocstrings), built with --strict into site/ and
# stamped with its sources' digest: tests/test_docs_site.py checks this site instead of building again.
docs: $(STAMP)
	$(PY) scripts/build_docs.py site

# TrainerPlus & co. against every supported transformers, each in .venv-compat-<version>
# (pins in compat/transformers-<version>.txt; venvs are built once and reused).
COMPAT_VERSIONS ?= 4.41.2 4.46.3 4.57.6 5.23.0
compat:
	@set -e; for version in $(COMPAT_VERSIONS); do \
		echo "== transformers $$version"; PYTHON=$(PYTHON) compat/run.sh $$version; done

clean:
	rm -rf $(VENV) runs site .pytest_cache
