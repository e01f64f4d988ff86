# The two commands the README promises: `make demo` and `make test`. Each installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test bench install

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[runtime,test]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/gpushare demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider
