# nib — two commands on a fresh machine:
#   make serve   installs into .venv and serves completions from the shipped model
#   make test    installs into .venv and runs the tests (GPU tests skip without CUDA)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU-only machines get the CPU build of torch (fast to install); machines with an
# NVIDIA driver get the default (CUDA) build. Override: make test TORCH_SPEC=...
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
SERVE_ARGS ?=
PYTEST_ARGS ?=
# The wire contract as last released, as a buf image: `make lint` fails on any
# breaking change against it. Committed, so the check needs no git history
# (clean or shallow clones, CI). Cut a release: make proto-release VERSION=x.y.z
PROTO_RELEASED ?= proto/released/nib-v1-0.1.0.json

.PHONY: setup serve test test-unit test-integration test-gpu lint proto proto-check proto-release bench load-test clean \
	editor-tools check-vscode gpu-wheels

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[dev]" --config-settings editable_mode=strict
	touch $@

serve: setup
	$(VENV)/bin/nib serve $(SERVE_ARGS)

# The wheels a GPU run carries to the lent host (no network there) in .whl/: nib's
# runtime requirements the host's image lacks, at the versions installed here.
gpu-wheels: setup
	$(PY) tools/gpu_wheels.py

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
define run_pytest
	@$(PY) -m pytest $(1) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests in $(1)"; exit 1; fi; exit $$rc
endef

# Beyond Python, the editor tests need Neovim (a real LSP client, tests/integration/
# test_bridge_neovim.py) and Node (tsc for the VS Code extension). Missing ones are
# installed from the distribution's packages when apt-get can run (as root, or with
# sudo that needs no password); otherwise the note says what is skipped and why.
define apt_install
	if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1)) >/dev/null; \
	elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
		(sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1)) >/dev/null; \
	else \
		echo "note: cannot install $(1) (needs apt-get as root or passwordless sudo): $(2)"; \
	fi
endef

editor-tools:
	@command -v nvim >/dev/null 2>&1 || $(call apt_install,neovim,the Neovim test is skipped)
	@command -v npm >/dev/null 2>&1 || $(call apt_install,nodejs npm,the VS Code extension is not type-checked)

VSCODE_DIR := ide-extension-bridge/vscode

# The VS Code extension type-checks against its pinned dependencies (package-lock.json).
check-vscode: editor-tools
	@if command -v npm >/dev/null 2>&1; then \
		cd $(VSCODE_DIR) && npm ci --no-audit --no-fund --loglevel=error >/dev/null && \
		npx --no-install tsc --noEmit -p . && echo "VS Code extension: tsc --noEmit passed"; \
	else \
		echo "SKIPPED: VS Code extension type check (npm is not installed and could not be installed)"; \
	fi

test: setup check-vscode
	$(call run_pytest,tests/unit tests/integration tests/gpu)

test-unit: setup
	$(call run_pytest,tests/unit)

test-integration: setup
	$(call run_pytest,tests/integration)

test-gpu: setup
	$(call run_pytest,tests/gpu)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -p nib.sdk -p nib.service -p nib.bridge
	$(PY) tools/gen_proto.py --check
	$(VENV)/bin/buf lint
	$(VENV)/bin/buf breaking --against $(PROTO_RELEASED)
	$(VENV)/bin/kubernetes-validate --strict --quiet deploy/k8s/*.yaml
	$(VENV)/bin/envoy --mode validate -c deploy/envoy/envoy.yaml -l warning
	$(PY) deploy/envoy/render.py configmap --check

proto: setup
	$(PY) tools/gen_proto.py

proto-check: setup
	$(PY) tools/gen_proto.py --check

proto-release: setup
	@test -n "$(VERSION)" || { echo "usage: make proto-release VERSION=x.y.z"; exit 1; }
	$(VENV)/bin/buf build --exclude-source-info -o proto/released/nib-v1-$(VERSION).json
	$(PY) -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); open(p,'w').write(json.dumps(d, indent=1) + '\\n')" proto/released/nib-v1-$(VERSION).json
	@echo "now set PROTO_RELEASED in the Makefile to proto/released/nib-v1-$(VERSION).json"

# A bounded load test on loopback (starts its own server; see bench/load_test.py).
load-test: setup
	$(PY) bench/load_test.py $(LOAD_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache \
		$(VSCODE_DIR)/node_modules $(VSCODE_DIR)/out
