PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_ROOT ?= .mqstore-data
TOOLS := .tools
PROMTOOL := $(TOOLS)/usr/bin/promtool

.PHONY: run test bench clean tools

# pyspark_mqstore.py: an editable install copies it (see core/spark/packaging/mqstore_build.py).
# The spark extra builds pyspark from its sdist (about 40 s, once); its tests need Java 17.
# The grpc extra: the gRPC endpoint of `mqstore serve` and the official RocketMQ client.
# The ha extra: automatic failover on etcd (mqstore.coordination); the test extra brings etcd.
$(STAMP): pyproject.toml pyspark_mqstore.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,spark,grpc,ha]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mqstore demo --config config/mqstore.yaml --root $(RUN_ROOT)

# The suite runs on TEST_WORKERS pytest-xdist workers (--dist loadgroup, pyproject.toml): most
# of a test's time is spent waiting on processes it started, so a 2-core machine runs four.
TEST_WORKERS ?= 4

test: $(STAMP) tools
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# The checkers of config/: promtool (from Debian's prometheus package, unpacked here, not
# installed) for config/prometheus/, systemd-analyze (Debian's systemd) for config/systemd/.
# Where apt-get cannot fetch them, their tests skip with the reason, and fail under CI=true.
tools: $(PROMTOOL)
	command -v systemd-analyze >/dev/null || apt-get install -y --no-install-recommends systemd \
		|| echo "systemd-analyze not installed: tests/ops/test_opskit.py skips its unit check"

$(PROMTOOL):
	rm -rf $(TOOLS)/deb && mkdir -p $(TOOLS)/deb
	(cd $(TOOLS)/deb && (apt-get download prometheus || (apt-get update && apt-get download \
		prometheus)) && dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x -C .. ./usr/bin/promtool) \
		|| echo "promtool not installed: tests/ops/test_opskit.py skips its rule checks"
	rm -rf $(TOOLS)/deb

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_put_get.py

clean:
	rm -rf $(VENV) $(RUN_ROOT) $(TOOLS)
