# The two commands the README promises: `make demo` and `make test`. Each installs what it needs:
# the demo only the light core (no torch); the tests also the runtime extra and the test tools.
VENV ?= .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.core-stamp
FULL := $(VENV)/.full-stamp

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test install

install: $(FULL)

$(CORE): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(FULL): $(CORE)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[runtime,test]'
	touch $@

demo: $(CORE)
	$(VENV)/bin/gpushare demo

test: $(FULL)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -p no:cacheprovider
