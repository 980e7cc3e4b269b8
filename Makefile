PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_ROOT ?= .mqstore-data

.PHONY: run test bench clean

# pyspark_mqstore.py: an editable install copies it (see core/spark/packaging/mqstore_build.py).
# The spark extra builds pyspark from its sdist (about 40 s, once); its tests need Java 17.
# The grpc extra: the gRPC endpoint of `mqstore serve` and the official RocketMQ client.
$(STAMP): pyproject.toml pyspark_mqstore.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,spark,grpc]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mqstore demo --config config/mqstore.yaml --root $(RUN_ROOT)

# The suite runs on TEST_WORKERS pytest-xdist workers (--dist loadgroup, pyproject.toml): most
# of a test's time is spent waiting on processes it started, so a 2-core machine runs four.
TEST_WORKERS ?= 4

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_put_get.py

clean:
	rm -rf $(VENV) $(RUN_ROOT)
