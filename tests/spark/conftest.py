"""One local[2] SparkSession for every Spark test, and stores to point it at.

Spark runs Python in worker processes it starts itself: they must run this interpreter
(PYSPARK_PYTHON, or they pick whatever python3 PATH has, without mqstore or pyarrow), and the
environment must be set before the session starts (the JVM and its workers inherit it then).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from mqstore import MessageStore, load_config
from spark_helpers import SMALL_STORE, local_spark

JAVA_HINT = ("the Spark tests need Java 17 or later (the JVM PySpark 4.3 runs on): install a "
             "JDK 17 and put java on PATH or set JAVA_HOME")


def java_version(java: str) -> int | None:
    """The major version ``java -version`` reports, or None when it does not run."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    return int(match.group(1)) if out.returncode == 0 and match else None


def check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        pytest.fail(f"java not found (JAVA_HOME={home!r}, PATH has none): {JAVA_HINT}",
                    pytrace=False)
    major = java_version(java)
    if major is None or major < 17:
        pytest.fail(f"{java} reports Java {major}: {JAVA_HINT}", pytrace=False)


@pytest.fixture(scope="session")
def spark():
    check_java()
    session = local_spark("mqstore-tests", {
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
        "spark.driver.memory": "1g", "spark.sql.session.timeZone": "UTC",
        "spark.sql.python.filterPushdown.enabled": "true"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def small_config():
    return load_config(overrides=SMALL_STORE)


@pytest.fixture
def config_file(tmp_path):
    """The small-store configuration as a YAML file (what the write options take)."""
    import yaml
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(SMALL_STORE))
    return str(path)


@pytest.fixture
def open_store(small_config, manual_clock):
    """``open_store(root, read_only=False)``: a small store on the test's manual clock,
    closed at teardown."""
    opened = []

    def factory(root, read_only=False):
        store = MessageStore.open(root, small_config, read_only=read_only, clock=manual_clock)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()
