"""Staging a crashed driver left behind: swept by the next write, never a live job's.

A job's staged directory is locked by a lease for as long as its driver lives (NOTE [ Staging
leases ] in mqstore/spark/lease.py); a write sweeps only what it can lock.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mqstore import MessageStore
from mqstore.spark import lease, staging
from spark_helpers import stored_rows

CRASH_WRITER = Path(__file__).with_name("crash_spark_writer.py")


def locked(path) -> bool:
    """Whether a lease holds ``path`` (a staged directory)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def wait_for(condition, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.1)


def files(path) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(d, f), path): Path(d, f).read_bytes()
            for d, _dirs, names in os.walk(path) for f in names}


def bodies(root) -> list[tuple]:
    with MessageStore.open(root, read_only=True) as store:
        return [(r["topic"], r["queue_id"], r["queue_offset"], r["body"])
                for r in stored_rows(store)]


def write(spark, root, config, bodies_: list[bytes]) -> None:
    df = spark.createDataFrame([("orders", b, 0) for b in bodies_],
                               "topic string, body binary, queue_id int")
    df.write.format("mqstore").mode("append").option("path", str(root)) \
        .option("config", config).save()


def test_write_sweeps_a_killed_drivers_staging_but_never_a_live_jobs(spark, tmp_path,
                                                                       config_file):
    root = tmp_path / "store"
    stage_root = root / "spark-staging"
    write(spark, root, config_file, [b"kept-0", b"kept-1", b"kept-2", b"kept-3"])
    committed = [("orders", 0, i, b"kept-%d" % i) for i in range(4)]
    assert bodies(root) == committed and not stage_root.exists()

    # A driver of its own whose write hangs mid-task: partition 0 staged, partition 1 staging.
    log = tmp_path / "driver.log"
    with log.open("wb") as out:
        driver = subprocess.Popen([sys.executable, str(CRASH_WRITER), str(root), config_file],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def mid_write():
            names = [n for _d, _s, fs in os.walk(stage_root) for n in fs]
            return "part-00000-0.arrow" in names and any(n.endswith(".tmp") for n in names)
        wait_for(mid_write, 240, "the driver to stage", log)
        (crashed,) = stage_root.glob("job-*")
        assert locked(crashed)
        # Another job starts while that one runs: its sweep leaves the running job alone.
        live = staging.open_job(str(stage_root), driver=lease.process(os.getpid()))
        assert crashed.is_dir() and locked(live)
        Path(live, "part-00000-0.arrow").write_bytes(b"live job's rows")
        staged = files(crashed)
        assert "part-00000-0.arrow" in staged
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver: its Python and its JVM
        driver.wait(timeout=60)
    # Its lease ends with the driver's JVM; the staged partition stays (the hanging task may
    # still remove its own unfinished file as it dies).
    wait_for(lambda: not locked(crashed), 60, "the killed driver's lease to end")
    assert files(crashed)["part-00000-0.arrow"] == staged["part-00000-0.arrow"]
    assert bodies(root) == committed

    # The next write sweeps the dead job's staging, keeps the live job's, appends its rows once.
    write(spark, root, config_file, [b"next-0", b"next-1", b"next-2"])
    assert not crashed.exists()
    assert files(live) == {"part-00000-0.arrow": b"live job's rows"} and locked(live)
    assert bodies(root) == committed + [("orders", 0, 4 + i, b"next-%d" % i) for i in range(3)]
    staging.remove_job(live, str(stage_root))  # the live job ends: its lease with it
    assert not stage_root.exists()


SINK_DRIVER = """
import os, sys, time
from mqstore.spark import lease, staging
sink = staging.open_sink(sys.argv[1], "q1", driver=lease.process(os.getpid()))
os.mkdir(os.path.join(sink, "batch-7"))
with open(os.path.join(sink, "batch-7", "part-00000-0.arrow"), "wb") as f:
    f.write(b"staged")
print(sink, flush=True)
time.sleep(3600)
"""


def test_a_killed_streams_staging_is_swept_once_its_driver_is_gone(tmp_path):
    """A streaming sink's directory (its micro-batches inside) under a driver's lease."""
    stage_root = tmp_path / "staging"
    driver = subprocess.Popen([sys.executable, "-c", SINK_DRIVER, str(stage_root)],
                              stdout=subprocess.PIPE, text=True)
    try:
        sink = driver.stdout.readline().strip()
        assert sink == str(stage_root / "stream-q1") and locked(sink)
        assert staging.sweep(str(stage_root)) == []  # its driver lives
        assert files(sink) == {"batch-7/part-00000-0.arrow": b"staged"}
    finally:
        driver.kill()
        driver.wait(timeout=60)
        driver.stdout.close()
    wait_for(lambda: not locked(sink), 30, "the killed driver's lease to end")
    assert staging.sweep(str(stage_root)) == [sink]
    assert not stage_root.exists()
