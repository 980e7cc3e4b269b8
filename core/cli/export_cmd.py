"""``mqstore export STORE... --to DIR``: the Spark export job of ``mqstore.spark.export``.

This is the one command that needs Spark. It imports ``mqstore.spark`` only when it runs, so
``mqstore`` and its other commands work without the ``spark`` extra; without it, this command
fails with one line saying what to install. (pyproject.toml's "spark-leaf" contract names this
module as the one importer of ``mqstore.spark`` outside the connector.)
"""

from __future__ import annotations

import os
import time

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, json_option, store_dir
from mqstore.errors import StoreLockedError
from mqstore.ops.store_files import store_marks
from mqstore.storage.store_lock import holder

MODES = ("errorifexists", "overwrite", "append", "ignore")  # Spark's save modes, as the job's
SPARK_PACKAGES = ("pyspark", "pyarrow", "py4j")
GLOB_CHARS = "*?["  # a STORE with one of these is a glob: it matches store directories only
INSTALL_HINT = "pip install 'mqstore[spark]'"
JAVA_HINT = "Spark needs Java 17 or later: set JAVA_HOME or put java on PATH"


def _export_job():
    """``mqstore.spark.export``, or a one-line error when the ``spark`` extra is missing."""
    try:
        from mqstore.spark import export as job
    except ImportError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
        if (cause.name or "").partition(".")[0] not in SPARK_PACKAGES:
            raise  # not a missing extra: a bug, with its traceback
        raise click.ClickException(f"mqstore export needs the 'spark' extra: {INSTALL_HINT} "
                                   f"({cause})") from None
    return job


def _spark_failure(exc: BaseException) -> str:
    """A Spark error as one line: a Python worker's exception line, else the first line."""
    java = getattr(exc, "java_exception", None)  # py4j's Py4JJavaError
    text = str(java.toString()) if java is not None else str(exc)
    lines = [line.strip() for line in text.split("JVM stacktrace:")[0].splitlines()
             if line.strip()]
    if not lines:
        return type(exc).__name__
    line = lines[-1] if any(line.startswith("Traceback (") for line in lines) else lines[0]
    if "JAVA_GATEWAY_EXITED" in line:
        line += f" ({JAVA_HINT})"
    return line


class _RichLines:
    """A text stream for the job's progress lines, printed through rich on stderr."""

    def __init__(self) -> None:
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            output.err().print(line, markup=False, highlight=False, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass


@click.command()
@click.argument("stores", nargs=-1, required=True, metavar="STORE...")
@click.option("--to", "dest", required=True, metavar="DIR", help="Parquet output directory.")
@click.option("--format", "fmt", type=click.Choice(["parquet"]), default="parquet",
              show_default=True, help="Output format.")
@click.option("--topics", default=None, help="Comma-separated topics (default: all).")
@click.option("--mode", type=click.Choice(MODES), default="errorifexists", show_default=True,
              help="What to do when DIR exists (Spark's save modes).")
@config_option
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@json_option
def export(stores: tuple[str, ...], dest: str, fmt: str, topics: str | None, mode: str,
           config_path: str | None, master: str, as_json: bool) -> None:
    """Export stores to Parquet with Spark, partitioned by topic and store date (UTC).

    Every message of the stores STORE... (directories, or globs) becomes a row under
    DIR/topic=<topic>/date=<yyyy-mm-dd>/, with all the columns of a
    spark.read.format("mqstore") read plus date. This runs the export job of
    mqstore.spark.export (python -m mqstore.spark.export) in a Spark session of its own
    (--master): it needs the 'spark' extra (pip install 'mqstore[spark]') and Java 17. Prints
    what each topic will export, the share of Spark tasks done (on stderr), and the rows
    written. DIR is never a store's directory: that is refused before Spark starts.
    """
    for path in stores:  # bad input before the extra is looked for, as every command checks
        if not any(c in path for c in GLOB_CHARS):
            store_dir(path)
    dest = os.path.abspath(dest)
    _refuse_a_store(dest)
    job = _export_job()
    from mqstore.spark.stores import resolve_paths
    paths = [os.path.abspath(p) for p in stores]  # Spark's workers may run elsewhere
    config = os.path.abspath(config_path) if config_path else None
    roots = resolve_paths(tuple(paths))  # a bad path is bad input (exit 2), before Spark starts
    counts = job.planned_counts(paths, topics, config)
    started = time.monotonic()
    try:
        written = job.run(paths, dest, master=master, topics=topics, mode=mode, config=config,
                          out=_RichLines(), planned=counts)
    except job.spark_errors() as exc:  # a failed session or job: one line, exit 1
        raise click.ClickException(f"export to {dest!r} failed: {_spark_failure(exc)}") \
            from None
    _report({"stores": roots, "to": dest, "format": fmt, "mode": mode,
             "topics": dict(sorted(counts.items())), "planned": sum(counts.values()),
             "rows": written, "seconds": round(time.monotonic() - started, 3)}, as_json)


def _refuse_a_store(dest: str) -> None:
    """Spark's overwrite deletes DIR and append writes into it: never a store's directory,
    and above all not one some process holds open for writing."""
    held = holder(dest)
    if held is not None:
        raise StoreLockedError(f"export --to {dest!r}: that is a store, {held}; nothing was "
                               f"changed")
    found = store_marks(dest)
    if found:
        raise click.BadParameter(f"{dest!r} holds a store ({', '.join(found)}), not Parquet "
                                 f"output: export to another directory", param_hint="'--to'")


def _report(summary: dict, as_json: bool) -> None:
    if as_json:
        output.emit_json(summary)
        return
    output.print_table(("topic", "messages"), list(summary["topics"].items()))
    output.out().print(f"{summary['rows']} row(s) written as {summary['format']} to "
                       f"{summary['to']} in {summary['seconds']:.1f} s", markup=False,
                       highlight=False, soft_wrap=True)
