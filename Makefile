# Two entry points for a fresh machine: `make run` (a broker) and `make test` (the test suite).
# Each creates its own virtualenv in .venv and installs HareMQ into it.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(VENV)/bin/haremq node --name hare1 --data-dir ./haremq-data/hare1 --amqp-port 5672

test: $(VENV)/.installed
	$(PY) -m pytest -n 2 -p no:cacheprovider $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) haremq-data
