# The two commands a new machine needs: `make demo` and `make test`. Everything they need is
# installed by `make setup`, which both run first and which is cached after its first run.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup tools pin-tools system-packages demo test test-unit test-fuzz lint bench clean dashboards image \
	device-bundle

setup: $(STAMP) system-packages tools

$(STAMP): pyproject.toml
	@echo "==> Python environment in $(VENV)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

# Prometheus, promtool and Alertmanager come from Debian's packages.
system-packages:
	@bash hack/system-packages.sh

# Builds the Go parts read-only from their pins in hack/tools/ (docs/tools.md).
tools:
	@bash hack/build-tools.sh all

# Re-resolves the pins (hack/tools/*/go.mod, go.sum); the only step that may float. Review the diff.
pin-tools:
	@bash hack/pin-tools.sh all

# The main job on a local cluster: simulated GPU nodes, exporters, Prometheus and the controller
# playing the embedded scenario live (docs/demo.md). `gpumon demo --help` for its flags.
demo: setup
	@$(VENV)/bin/gpumon demo

test: setup lint
	@$(VENV)/bin/pytest -q -ra $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests were collected"; exit 1; fi; exit $$rc

test-unit: $(STAMP)
	@$(VENV)/bin/pytest -q -m unit $(PYTEST_ARGS)

test-fuzz: $(STAMP)
	@$(VENV)/bin/pytest -q -m fuzz $(PYTEST_ARGS)

lint: $(STAMP)
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check --output-format concise .
	@$(VENV)/bin/mypy
	@$(VENV)/bin/lint-imports --no-cache --no-logo

# The Linux container image (docs/images.md): IMAGE, PLATFORMS, BASE, CA_BUNDLE, VERSION and
# REVISION are passed through to hack/build-image.sh.
image:
	@bash hack/build-image.sh

# Regenerate dashboards/json/ from the Python in dashboards/ (the JSON is committed).
dashboards: $(STAMP)
	@$(PY) -m dashboards

bench: setup
	@$(VENV)/bin/python -m bench

# What the device check needs on a GPU machine without network (docs/nvml.md, "The device check"):
# gpumon's wheel and its dependencies' for CPython 3.12, at this environment's versions, and
# nvidia_gpu_exporter when GPUMON_PEER_SRC names its source. BUNDLE=DIR puts it elsewhere.
BUNDLE ?= .device-bundle
device-bundle: $(STAMP)
	@$(PY) -m bench device-bundle --out $(BUNDLE)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
