"""Packaging: Spark finds format("mqstore") with no registration in the editable install make
test uses, register() works too, the Java check speaks clearly, and the import contracts keep
Spark out of the core."""

from __future__ import annotations

import importlib.util
import pkgutil
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_discovery_module_is_where_pkgutil_looks():
    """Spark's lookup lists top-level modules with pkgutil.iter_modules(): the editable
    install must put pyspark_mqstore into a sys.path directory (site-packages), not only
    behind setuptools' import hook, which iter_modules never lists."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    assert "pyspark_mqstore" in {m.name for m in pkgutil.iter_modules([str(purelib)])}
    installed = purelib / "pyspark_mqstore.py"
    assert installed.read_bytes() == (ROOT / "pyspark_mqstore.py").read_bytes(), (
        "the installed copy is stale: reinstall (make test does when it changes)")
    module = importlib.import_module("pyspark_mqstore")
    from mqstore.spark import MqstoreDataSource
    assert module.DefaultSource is MqstoreDataSource


def test_format_found_without_register(spark, tmp_path, open_store):
    # Keep this the first use of the source in this module; nothing before it registers.
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    assert manager.dataSourceExists("mqstore")
    root = tmp_path / "s"
    from spark_helpers import put_messages
    put_messages(open_store(root), "t", 3)
    assert spark.read.format("mqstore").option("path", str(root)).load().count() == 3


def test_register_explicitly(spark):
    import mqstore.spark
    mqstore.spark.register(spark)  # the same class again: it replaces the discovered one
    assert spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("mqstore")


def test_editable_wheel_gets_the_discovery_module(tmp_path):
    backend = _load(ROOT / "core" / "spark" / "packaging" / "mqstore_build.py", "mqstore_build")
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo.pth", "import x\n")
        z.writestr("demo-1.0.dist-info/RECORD", "demo.pth,,\ndemo-1.0.dist-info/RECORD,,\n")
    backend._add_to_wheel(str(wheel), "pyspark_mqstore.py", b"print('hi')\n")
    with zipfile.ZipFile(wheel) as z:
        assert z.read("pyspark_mqstore.py") == b"print('hi')\n"
        record = z.read("demo-1.0.dist-info/RECORD").decode().splitlines()
        assert z.read("demo.pth") == b"import x\n"
    assert record[-1] == ("pyspark_mqstore.py,sha256="
                          "yvAm8l1xQCCfmAcmBTB6Q4kUuc5vPBSyPRXZZnJB3lI,12")


def test_java_check_names_what_is_missing(monkeypatch, tmp_path):
    spark_conftest = _load(Path(__file__).with_name("conftest.py"), "spark_conftest")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(pytest.fail.Exception, match="java not found .*Java 17 or later"):
        spark_conftest.check_java()
    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.2"\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(pytest.fail.Exception, match="reports Java 11: .*Java 17 or later"):
        spark_conftest.check_java()


def test_contracts_keep_spark_out_of_the_core(tmp_path):
    arch = _load(ROOT / "tests" / "project" / "test_architecture.py", "arch_for_spark")
    pkg = arch._stage(tmp_path)
    code, report = arch._lint(tmp_path)
    assert code == 0, report
    for name in ("only the connector and the export command import mqstore.spark",
                 "only mqstore.spark imports pyspark and pyarrow"):
        assert f"{name} KEPT" in report, report
    (pkg / "_spark_probe.py").write_text("from mqstore.spark import register\n")
    (pkg / "plugins" / "_spark_probe.py").write_text("import pyarrow\n")
    (pkg / "storage" / "_spark_probe.py").write_text("def f():\n    import pyspark.sql\n")
    code, report = arch._lint(tmp_path)
    assert code == 1, report
    assert "only the connector and the export command import mqstore.spark BROKEN" in report, report
    assert "only mqstore.spark imports pyspark and pyarrow BROKEN" in report, report
    for planted in ("mqstore._spark_probe -> mqstore.spark",
                    "mqstore.plugins._spark_probe -> pyarrow",
                    "mqstore.storage._spark_probe -> pyspark"):
        assert planted in report, f"{planted!r} not reported:\n{report}"
