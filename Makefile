# sessionmem: `make run` (the local stack) and `make test` (everything CI runs) set themselves up.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Each phase of `make test` and `make e2e` prints its duration (`[phase] NAME: Ns`), so a slow run says why.
PHASE := bash tools/ci/phase.sh
SUBMAKE := $(MAKE) --no-print-directory

.PHONY: run test lint typecheck unit integration bench soak envtest crds crds-check helm clean openapi \
	constraints e2e e2e-prereqs e2e-image e2e-binaries e2e-knative e2e-knative-conformance e2e-up e2e-down

$(STAMP): requirements.txt requirements-dev.txt requirements-adapters.txt requirements-faults.txt constraints.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

## Rewrites constraints.txt from the development environment (after a requirements file changed).
constraints: $(STAMP)
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | LC_ALL=C sort -f; } > constraints.txt.tmp
	@mv constraints.txt.tmp constraints.txt

## The main job: embedded Valkey, proxy, launcher and a demo agent; a conversation survives a cold restart.
run: $(STAMP)
	@$(PY) -m sessionmem_demo.stack

## Everything: lint, types, unit tests, and integration tests against real valkey-server and kube-apiserver.
test:
	@$(PHASE) venv $(SUBMAKE) $(STAMP)
	@$(PHASE) lint $(SUBMAKE) lint
	@$(PHASE) mypy $(SUBMAKE) typecheck
	@$(PHASE) envtest-build bash tools/envtest/ensure-binaries.sh >/dev/null
	@$(PHASE) pytest $(PY) -m pytest

lint: $(STAMP)
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	@$(VENV)/bin/mypy core infra proxy launcher operator demo client tests bench

unit: $(STAMP)
	@$(PY) -m pytest -m "not integration"

integration: $(STAMP)
	@$(PY) -m pytest -m integration

## Builds (once, cached per user) kube-apiserver, kube-controller-manager and etcd for the integration tests.
envtest:
	@bash tools/envtest/ensure-binaries.sh

## The e2e tier (root): a real single-node cluster on this host runs the image; see tools/e2e/README.md.
## Not part of `make test`. The cluster comes up for the run and goes down after it.
## Each step is a phase of its own (build, cluster, Knative, tests, teardown), so its time is printed; the
## cluster goes down after the tests unless SESSIONMEM_E2E_KEEP_CLUSTER=1.
e2e: $(STAMP)
	@$(PHASE) e2e-prereqs bash tools/e2e/prereqs.sh
	@$(PHASE) e2e-binaries bash tools/e2e/build-binaries.sh >/dev/null
	@$(PHASE) e2e-knative-build bash tools/e2e/build-knative.sh >/dev/null
	@$(PHASE) e2e-image bash tools/e2e/image.sh >/dev/null
	@$(PHASE) e2e-up env E2E_KNATIVE=0 bash tools/e2e/cluster.sh up >/dev/null \
		|| { bash tools/e2e/cluster.sh down; exit 1; }
	@$(PHASE) e2e-knative-up bash tools/e2e/cluster.sh knative >/dev/null \
		|| { bash tools/e2e/cluster.sh down; exit 1; }
	@rc=0; $(PHASE) e2e-tests $(PY) -m pytest -m e2e tests/e2e --durations=0 --durations-min=5 || rc=$$?; \
		if [ "$${SESSIONMEM_E2E_KEEP_CLUSTER:-}" != 1 ]; then $(PHASE) e2e-down bash tools/e2e/cluster.sh down; fi; \
		exit $$rc

e2e-prereqs:
	@bash tools/e2e/prereqs.sh

## The project's image (podman, on a Debian-made Python base) and the pause image, cached per content.
e2e-image: e2e-prereqs
	@bash tools/e2e/image.sh

## kubelet, kube-scheduler, kube-proxy, kubectl, CoreDNS and pause, built once per version.
e2e-binaries:
	@bash tools/e2e/build-binaries.sh

## Knative Serving's controller, activator, autoscaler, webhook and queue, and kingress: one go build.
e2e-knative:
	@bash tools/e2e/build-knative.sh

## knative.dev/networking's KIngress conformance suite against the e2e cluster's kingress (cluster up).
e2e-knative-conformance:
	@bash tools/e2e/knative-conformance.sh

## Brings the e2e cluster up (and leaves it up: KUBECONFIG is printed) / down.
e2e-up:
	@bash tools/e2e/cluster.sh up

e2e-down:
	@bash tools/e2e/cluster.sh down

## Regenerates the CRDs from the operator's schema, straight into the chart (crds/ is a link to that folder).
crds: $(STAMP)
	@$(PY) -m sessionmem_operator.crds --write charts/sessionmem/crds

crds-check: $(STAMP)
	@$(PY) -m sessionmem_operator.crds --check charts/sessionmem/crds

helm:
	@bash tools/helm/ensure-helm.sh

## Benchmarks side by side with raw Valkey and the peer libraries; writes docs/benchmarks.md.
bench: $(STAMP)
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements-bench.txt
	@$(PY) -m bench

soak: $(STAMP)
	@$(PY) -m bench.soak

## The proxy's OpenAPI document, generated from its route table (a test checks the committed one is current).
openapi: $(STAMP)
	@$(PY) -m sessionmem_proxy.openapi --write

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
