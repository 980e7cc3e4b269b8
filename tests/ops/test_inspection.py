"""``mqstore inspect``'s decoders (``ops.inspection``), called directly on real store files: what
a file is taken for, and what each decoder shows of an intact, a damaged or a misplaced file."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from mqstore import Message
from mqstore.ops.inspection import Inspection, detect_kind, inspect_path
from mqstore.ops.inspection.commit_log import inspect_segment
from mqstore.ops.inspection.queue_files import inspect_queue_file
from mqstore.ops.inspection.small_files import inspect_abort, inspect_checkpoint, inspect_json

pytestmark = pytest.mark.loops("thread")
FIRST = f"{0:020d}"


@pytest.fixture
def closed_store(make_store, tmp_path):
    """A closed copy of a store holding 5 messages of T/0 (offsets and sizes returned)."""
    store = make_store()
    results = [store.put(Message("T", b"m%d" % i, queue_id=0, tags="a")) for i in range(5)]
    store.wait_dispatched()
    store.flush_metadata()
    root = tmp_path / "copy"
    store.close()
    shutil.copytree(store.root, root)
    return root, [r.phys_offset for r in results], [r.size for r in results]


def test_a_file_is_told_by_its_name_and_place(closed_store, tmp_path):
    root, _offsets, _sizes = closed_store
    assert detect_kind(str(root / "commitlog" / FIRST)) == "commitlog"
    assert detect_kind(str(root / "consumequeue" / "T" / "0" / FIRST)) == "consumequeue"
    assert detect_kind(str(root / "checkpoint")) == "checkpoint"
    assert detect_kind(str(root / "mqstore.json")) == "json"
    loose = tmp_path / "12345"
    shutil.copy(root / "commitlog" / FIRST, loose)  # out of place: its first record tells
    assert detect_kind(str(loose)) == "commitlog"
    (tmp_path / "777").write_bytes(b"\1" * 64)
    with pytest.raises(ValueError, match=r"cannot tell what .*777' is from its name and place; "
                                         r"pass --kind \(commitlog, consumequeue, index, "):
        detect_kind(str(tmp_path / "777"))
    with pytest.raises(ValueError, match="is a directory: inspect takes one file"):
        inspect_path(str(root))


def test_a_segment_shows_each_record_then_where_its_data_ends(closed_store):
    root, offsets, sizes = closed_store
    result = inspect_segment(str(root / "commitlog" / FIRST), None, 100)
    assert [(r["offset"], r["size"], r["type"], r["crc"]) for r in result.rows] == [
        (o, s, "record", "ok") for o, s in zip(offsets, sizes)]
    assert result.fields["data ends at"] == offsets[-1] + sizes[-1]
    page = inspect_segment(str(root / "commitlog" / FIRST), offsets[1], 2)
    assert [r["offset"] for r in page.rows] == offsets[1:3] and page.next_at == offsets[3]


def test_damaged_bytes_are_one_row_up_to_the_next_intact_record(closed_store):
    root, offsets, sizes = closed_store
    path = root / "commitlog" / FIRST
    with open(path, "r+b") as f:
        f.seek(offsets[1] + 4)
        f.write(b"\0\0\0\0")  # the magic code of record 1
    result = inspect_segment(str(path), None, 100)
    assert [(r["offset"], r["size"], r["type"]) for r in result.rows] == [
        (offsets[0], sizes[0], "record"), (offsets[1], sizes[1], "damaged"),
        *((o, s, "record") for o, s in zip(offsets[2:], sizes[2:]))]
    with pytest.raises(ValueError, match=r"--at 99999999 is outside this segment \[0, "):
        inspect_segment(str(path), 99_999_999, 10)


def test_queue_units_are_checked_against_their_records(closed_store):
    root, offsets, sizes = closed_store
    path = root / "consumequeue" / "T" / "0" / FIRST
    with open(path, "r+b") as f:
        f.seek(2 * 20)
        f.write(struct.pack(">q", offsets[3]))  # unit 2 names record 3
    result = inspect_queue_file(str(path), None, 100)
    assert [r["phys_offset"] for r in result.rows[:5]] == [offsets[0], offsets[1], offsets[3],
                                                          offsets[3], offsets[4]]
    assert isinstance(result, Inspection) and result.kind == "consumequeue"
    checks = [r.get("record") for r in result.rows[:5]]
    assert checks[2] != checks[0] and checks[0] == checks[1] == checks[3] == checks[4], checks


def test_the_checkpoint_and_a_short_one(closed_store, tmp_path):
    root, offsets, sizes = closed_store
    fields = inspect_checkpoint(str(root / "checkpoint")).fields
    assert fields["file bytes"] == 4096 and "problem" not in fields
    assert fields["confirmPhyOffset"] == offsets[-1] + sizes[-1]
    short = tmp_path / "short" / "checkpoint"
    short.parent.mkdir()
    short.write_bytes((root / "checkpoint").read_bytes()[:40])
    assert inspect_checkpoint(str(short)).fields["problem"] == (
        "a checkpoint is 4096 bytes, this one 40")
    with pytest.raises(ValueError, match="is not named 'checkpoint'"):
        inspect_checkpoint(str(root / "mqstore.json"))


def test_an_abort_marker_says_whether_its_writer_lives(tmp_path):
    (tmp_path / "abort").write_text(str(os.getppid()))  # a live process, not the inspecting one
    assert inspect_abort(str(tmp_path / "abort")).fields["writer alive"] is True
    (tmp_path / "abort").write_text(str(os.getpid()))  # this one: inspecting, not writing
    assert inspect_abort(str(tmp_path / "abort")).fields["writer alive"] is False
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "abort").write_text(gone)
    fields = inspect_abort(str(tmp_path / "abort")).fields
    assert (fields["pid"], fields["writer alive"]) == (int(gone), False)
    (tmp_path / "abort").write_text("")  # RocketMQ 4.x leaves it empty
    assert inspect_abort(str(tmp_path / "abort")).fields["pid"] is None


def test_json_files_as_offset_tables_or_fields(tmp_path):
    offsets = tmp_path / "consumerOffset.json"
    offsets.write_text(json.dumps({"offsetTable": {"T@g": {"1": 7, "0": 3}}}))
    result = inspect_json(str(offsets))
    assert result.kind == "consumer-offsets"
    assert result.rows == [{"topic": "T", "group": "g", "queue_id": 0, "offset": 3},
                           {"topic": "T", "group": "g", "queue_id": 1, "offset": 7}]
    delay = tmp_path / "delayOffset.json"
    delay.write_text(json.dumps({"offsetTable": {"2": 5, "1": 4}}))
    assert [r["key"] for r in inspect_json(str(delay)).rows] == ["1", "2"]
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds JSON, but not an object"):
        inspect_json(str(listed))
