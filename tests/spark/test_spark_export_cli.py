"""``mqstore export``: the export job from the operator CLI; and the CLI without pyspark.

The export runs in process (click's runner), so the job reuses the session's SparkSession
instead of starting a JVM of its own; the command line without pyspark runs as subprocesses.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from click.testing import CliRunner

from cli_support import SMALL_CONFIG, env
from mqstore.cli import main
from spark_helpers import put_messages

# The mqstore command with pyspark and pyarrow unimportable, as without the spark extra.
NO_SPARK = ("import sys; sys.modules['pyspark'] = sys.modules['pyarrow'] = None; "
            "from mqstore.cli import main; main(prog_name='mqstore')")


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="mqstore")


def test_export_writes_exactly_the_stored_rows(spark, tmp_path, open_store):
    root, dest = tmp_path / "store", tmp_path / "out"
    store = open_store(root)
    put_messages(store, "orders", 5, queues=2)  # orders-i in queue i % 2
    put_messages(store, "audit", 2)
    result = cli("export", root, "--to", dest, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["seconds"] > 0
    del summary["seconds"]
    assert summary == {"stores": [str(root)], "to": str(dest), "format": "parquet",
                       "mode": "errorifexists", "topics": {"audit": 2, "orders": 5},
                       "planned": 7, "rows": 7}
    assert "export: 7 messages of 2 topic(s)" in result.stderr
    assert "tasks done (100%)" in result.stderr
    # one duration for one job, the summary's: the job's own last line has none
    assert "export: wrote 7 rows\n" in result.stderr
    assert not re.search(r"\d s\b", result.stderr), result.stderr
    got = sorted((r.topic, r.queue_id, r.queue_offset, r.body)
                 for r in spark.read.parquet(str(dest)).collect())
    assert got == [("audit", 0, 0, b"audit-0"), ("audit", 0, 1, b"audit-1"),
                   ("orders", 0, 0, b"orders-0"), ("orders", 0, 1, b"orders-2"),
                   ("orders", 0, 2, b"orders-4"), ("orders", 1, 0, b"orders-1"),
                   ("orders", 1, 1, b"orders-3")]
    # Spark's own refusal (DIR exists, default mode) is one line, exit 1; a bad store, exit 2.
    again = cli("export", root, "--to", dest)
    assert again.exit_code == 1
    (line,) = again.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"Error: export to '{dest}' failed: [PATH_ALREADY_EXISTS]"), line
    bad = cli("export", tmp_path / "nowhere", "--to", tmp_path / "x")
    assert bad.exit_code == 2
    assert bad.stderr.splitlines() == [f"Error: store directory '{tmp_path / 'nowhere'}' does "
                                       f"not exist"]


# Several commands in one process without pyspark (click's runner): exit codes and output.
NO_SPARK_COMMANDS = """
import json, sys
sys.modules["pyspark"] = sys.modules["pyarrow"] = None
from click.testing import CliRunner
from mqstore.cli import main
results = [CliRunner().invoke(main, args, prog_name="mqstore") for args in json.loads(sys.argv[1])]
print(json.dumps([[r.exit_code, r.stdout] for r in results]))
"""


def test_cli_works_without_pyspark_and_export_says_what_to_install(tmp_path):
    root, config = str(tmp_path / "store"), tmp_path / "small.yaml"
    config.write_text(SMALL_CONFIG)
    commands = [["--help"], ["export", "--help"],
                ["produce", root, "-c", str(config), "-t", "orders", "-q", "0", "--json", "a",
                 "b"],
                ["stats", root, "-c", str(config), "--json"]]
    run = subprocess.run([sys.executable, "-c", NO_SPARK_COMMANDS, json.dumps(commands)],
                         capture_output=True, text=True, timeout=120, env=env())
    assert run.returncode == 0, run.stderr
    codes, (helped, export_help, made, stats) = zip(*json.loads(run.stdout))
    assert codes == (0, 0, 0, 0), run.stdout
    assert "export" in helped and "--to DIR" in export_help
    assert json.loads(made)["count"] == 2
    assert [t["topic"] for t in json.loads(stats)["topics"]] == ["orders"]
    # The real command line: one line, exit 1.
    failed = subprocess.run([sys.executable, "-c", NO_SPARK, "export", root, "--to",
                             str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, env=env())
    assert failed.returncode == 1
    assert failed.stdout == ""
    assert failed.stderr.splitlines() == [
        "Error: mqstore export needs the 'spark' extra: pip install 'mqstore[spark]' "
        "(import of pyarrow halted; None in sys.modules)"]
