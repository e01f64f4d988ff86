# The two commands the README promises: `make demo` and `make test`. Each installs what it needs:
# the demo only the light core (no torch); the tests also the runtime extra and the test tools.
# The install's artifacts: `make images` (the slim controller image and the CUDA worker/profiler image) and
# `make install.yaml` (one manifest). The image references are set here, once: override REGISTRY, VERSION,
# CONTROLLER_IMAGE or WORKER_IMAGE on the command line (make images install.yaml REGISTRY=registry.example/me).
VENV ?= .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.core-stamp
FULL := $(VENV)/.full-stamp

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test install images install.yaml lock

VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REGISTRY ?= ghcr.io/gpushare
CONTROLLER_IMAGE ?= $(REGISTRY)/gpushare-controller:$(VERSION)
WORKER_IMAGE ?= $(REGISTRY)/gpushare-worker:$(VERSION)
# The pinned base (a Python patch release on a Debian release), named once: in the Dockerfiles' ARG BASE_IMAGE.
BASE_IMAGE ?= $(shell sed -n 's/^ARG BASE_IMAGE=//p' Dockerfile.controller)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
CREATED ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
IMAGE_ARGS = --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
             --build-arg CREATED=$(CREATED)
# buildah, podman or docker: the first one found.
BUILDER ?= $(firstword $(foreach tool,buildah podman docker,$(if $(shell command -v $(tool)),$(tool))))
BUILD = $(if $(filter buildah,$(BUILDER)),buildah bud --layers,$(BUILDER) build)

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

# Both images, then a smoke test of each: the controller's CLI runs the demo (git, no torch), the worker image
# imports the worker and profiler and prints torch's CUDA version (the driver minimum follows from it).
# BASE_IMAGE replaces the pinned base (e.g. a mirror of it); BUILD_FLAGS reach the builder (e.g. --network host;
# in a container without user namespaces: BUILDAH_ISOLATION=chroot make images BUILD_FLAGS="--network host").
BUILD_FLAGS ?=
RUN_CONTROLLER = $(if $(filter buildah,$(BUILDER)),buildah run $$(buildah from $(CONTROLLER_IMAGE)) -- gpushare,$(BUILDER) run --rm $(CONTROLLER_IMAGE))
RUN_WORKER = $(if $(filter buildah,$(BUILDER)),buildah run $$(buildah from $(WORKER_IMAGE)) --,$(BUILDER) run --rm $(WORKER_IMAGE))
images:
	@test -n "$(BUILDER)" || { echo "make images: needs buildah, podman or docker (apt-get install -y buildah)"; exit 1; }
	$(BUILD) $(BUILD_FLAGS) $(IMAGE_ARGS) -f Dockerfile.controller -t $(CONTROLLER_IMAGE) .
	$(BUILD) $(BUILD_FLAGS) $(IMAGE_ARGS) -f Dockerfile.worker -t $(WORKER_IMAGE) .
	$(RUN_CONTROLLER) demo
	$(RUN_WORKER) python -c "import torch, worker, profiler_job; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# One install manifest (config/'s objects) with CONTROLLER_IMAGE and WORKER_IMAGE set: kubectl apply -f install.yaml
install.yaml: $(CORE)
	$(PY) -m controller.cli.installmanifest --controller-image $(CONTROLLER_IMAGE) --worker-image $(WORKER_IMAGE) > $@

# The images' dependency locks (every package pinned with its hashes, for Linux x86_64 and Python 3.11, the base's):
# rerun after a change to pyproject.toml's dependencies. Needs uv (pip install uv).
LOCK = uv pip compile pyproject.toml --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
       --no-header --quiet
lock:
	$(LOCK) -o requirements/controller.lock
	$(LOCK) --extra runtime -o requirements/worker.lock
