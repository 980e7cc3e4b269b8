"""The store's small files: how they are written (old or new, never a mix; a full disk named),
what lands on disk byte for byte, and how a damaged one is reported."""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import zlib

import pytest

from mqstore.consumer import group_configs
from mqstore.errors import CorruptStateError, DiskFullError, StoreCorruptError
from mqstore.storage import (
    abort_file, delay_offsets, durable_file, meta_file, sealed_json, timer_progress, topic_file,
)
from mqstore.storage.checkpoint import CHECKPOINT_BYTES, Checkpoint


# -- durable_file -------------------------------------------------------------------------------

def test_replace_file_puts_the_new_bytes_in_place_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "doc"
    path.write_bytes(b"old")
    (tmp_path / "doc.tmp").write_bytes(b"a writer killed mid-write left this")
    durable_file.replace_file(str(path), b"new", fsync=True, sync_directory=True)
    assert path.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["doc"]


def test_a_failed_replacement_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "doc"
    path.write_bytes(b"old")

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable_file.os, "write", full)
    with pytest.raises(DiskFullError, match=rf"^no space to write {path}: "):
        durable_file.replace_file(str(path), b"new", fsync=True)
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["doc"]


def test_another_os_error_is_raised_as_it_is(tmp_path, monkeypatch):
    def denied(fd, data):
        raise PermissionError(errno.EACCES, "denied")

    monkeypatch.setattr(durable_file.os, "write", denied)
    with pytest.raises(PermissionError) as caught:
        durable_file.write_small_file(str(tmp_path / "f"), b"x")
    assert not isinstance(caught.value, DiskFullError)


def test_write_all_writes_every_byte_when_the_kernel_takes_fewer(tmp_path, monkeypatch):
    real = os.write
    monkeypatch.setattr(durable_file.os, "write", lambda fd, data: real(fd, bytes(data[:3])))
    durable_file.write_small_file(str(tmp_path / "f"), b"0123456789")
    assert (tmp_path / "f").read_bytes() == b"0123456789"


def test_read_all_refuses_a_directory_in_the_files_place(tmp_path):
    (tmp_path / "doc").mkdir()
    fd = os.open(tmp_path / "doc", os.O_RDONLY)
    try:
        with pytest.raises(CorruptStateError, match=r"is not a file \(a directory or a device"):
            durable_file.read_all(fd, str(tmp_path / "doc"))
    finally:
        os.close(fd)


# The documents read whole and decoded: topics.json, subscriptionGroup.json, delayOffset.json,
# the timers' progress.
DOCUMENTS = {
    "topics": (topic_file.topics_path, lambda root: topic_file.read_table(
        topic_file.topics_path(root))),
    "group configs": (group_configs.groups_path, lambda root: group_configs.read_table(
        group_configs.groups_path(root))),
    "delay offsets": (delay_offsets.delay_offsets_path, delay_offsets.read_delay_offsets),
    "timer progress": (timer_progress.timer_progress_path, timer_progress.read_timer_progress),
}


@pytest.mark.parametrize("document", DOCUMENTS)
def test_a_document_with_a_directory_in_its_place_is_refused_naming_it(tmp_path, document):
    path_of, read = DOCUMENTS[document]
    path = path_of(str(tmp_path))
    os.makedirs(path)
    with pytest.raises(CorruptStateError, match=rf"^{re.escape(path)} is not a file \(a "
                                                r"directory or a device"):
        read(str(tmp_path))
    assert os.path.isdir(path)


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("content, problem", [
    (b"", "the file is empty"), (b" \n", "the file is empty"),
    (b"\xff{}", "not UTF-8 (invalid start byte at byte 0)"),
])
def test_a_damaged_document_is_refused_naming_it_and_the_problem(tmp_path, document, content,
                                                                  problem):
    path_of, read = DOCUMENTS[document]
    path = path_of(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptStateError) as caught:
        read(str(tmp_path))
    assert path in str(caught.value) and f": {problem};" in str(caught.value)
    assert open(path, "rb").read() == content


# -- sealed_json ------------------------------------------------------------------------------

def test_a_sealed_file_is_compact_sorted_json_with_the_crc_of_the_rest(tmp_path):
    path = tmp_path / "mqstore.queued"
    sealed_json.write_sealed(str(path), {"b": 2, "a": [1, "x"]})
    body = b'{"a":[1,"x"],"b":2}'
    assert path.read_bytes() == (b'{"a":[1,"x"],"b":2,"crc32":' + str(zlib.crc32(body)).encode()
                                 + b"}")
    assert sealed_json.read_sealed(str(path)) == ({"a": [1, "x"], "b": 2}, None)


@pytest.mark.parametrize("damage, why", [
    (lambda raw: raw.replace(b'"b":2', b'"b":3'), "it is garbled (CRC mismatch)"),
    (lambda raw: raw[:-5], "it is garbled (Expecting"),
    (lambda raw: raw.replace(b'"crc32"', b'"crc"'), "it is garbled (no CRC)"),
    (lambda raw: b"\xff" + raw, "it is garbled ('utf-8' codec can't decode"),
])
def test_a_damaged_sealed_file_is_not_trusted_and_says_why(tmp_path, damage, why):
    path = tmp_path / "sealed"
    sealed_json.write_sealed(str(path), {"b": 2})
    path.write_bytes(damage(path.read_bytes()))
    body, problem = sealed_json.read_sealed(str(path))
    assert body is None and problem.startswith(f"{path}: {why}"), problem


def test_a_missing_sealed_file_is_neither_body_nor_problem(tmp_path):
    assert sealed_json.read_sealed(str(tmp_path / "none")) == (None, None)


# -- meta_file, abort_file ------------------------------------------------------------------

def test_mqstore_json_is_written_indented_and_sorted_and_read_back(tmp_path):
    meta_file.write_meta(str(tmp_path), {"hash": "mmh3", "consume_queue_file_bytes": 6000000})
    assert (tmp_path / "mqstore.json").read_text() == (
        '{\n  "consume_queue_file_bytes": 6000000,\n  "hash": "mmh3"\n}')
    assert meta_file.read_meta(str(tmp_path)) == {"hash": "mmh3",
                                                 "consume_queue_file_bytes": 6000000}
    assert meta_file.read_meta(str(tmp_path / "elsewhere")) is None


@pytest.mark.parametrize("content, problem", [
    (b'{"hash": ', "cannot read store metadata"),
    (b'["mmh3"]', "must hold a JSON object"),
])
def test_a_damaged_mqstore_json_is_refused_naming_it(tmp_path, content, problem):
    (tmp_path / "mqstore.json").write_bytes(content)
    with pytest.raises(StoreCorruptError, match=rf"{problem}") as caught:
        meta_file.read_meta(str(tmp_path))
    assert str(tmp_path / "mqstore.json") in str(caught.value)


def test_the_abort_marker_holds_the_writers_pid_and_goes_once(tmp_path):
    root = str(tmp_path)
    assert not abort_file.abort_exists(root)
    abort_file.create_abort(root)
    assert (tmp_path / "abort").read_text() == str(os.getpid())
    assert abort_file.abort_exists(root)
    abort_file.remove_abort(root)
    abort_file.remove_abort(root)  # gone already: nothing to do
    assert not abort_file.abort_exists(root)


# -- checkpoint -------------------------------------------------------------------------------

def test_the_checkpoint_is_4096_bytes_of_big_endian_fields_and_a_close_zeroes_appended(tmp_path):
    cp = Checkpoint(str(tmp_path))
    cp.physic_msg_timestamp, cp.logics_msg_timestamp = 1_700_000_000_123, 1_700_000_000_100
    cp.index_msg_timestamp, cp.confirm_phy_offset = 1_700_000_000_050, 4096
    cp.flush(logics_msg_timestamp=1_700_000_000_077)  # sampled before the queues were forced
    cp.note_appended(5000)
    raw = (tmp_path / "checkpoint").read_bytes()
    assert len(raw) == CHECKPOINT_BYTES
    assert struct.unpack_from(">6q", raw) == (1_700_000_000_123, 1_700_000_000_077,
                                              1_700_000_000_050, 0, 4096, 5000)
    assert raw[48:] == bytes(CHECKPOINT_BYTES - 48)
    cp.close()
    raw = (tmp_path / "checkpoint").read_bytes()
    # RocketMQ's file again; the close writes what it holds (no sample to override it).
    assert struct.unpack_from(">6q", raw) == (1_700_000_000_123, 1_700_000_000_100,
                                              1_700_000_000_050, 0, 4096, 0)
    again = Checkpoint(str(tmp_path), read_only=True)
    assert (again.physic_msg_timestamp, again.appended_offset) == (1_700_000_000_123, 0)
    assert again.min_timestamp() == 1_700_000_000_100 - 3000


def test_a_short_checkpoint_reads_as_zeros_and_is_made_whole_by_a_writer(tmp_path):
    (tmp_path / "checkpoint").write_bytes(struct.pack(">q", 1234))
    reader = Checkpoint(str(tmp_path), read_only=True)
    assert (reader.physic_msg_timestamp, reader.logics_msg_timestamp) == (1234, 0)
    assert (tmp_path / "checkpoint").stat().st_size == 8  # a reader changes nothing
    writer = Checkpoint(str(tmp_path))
    assert (tmp_path / "checkpoint").stat().st_size == CHECKPOINT_BYTES
    writer.close()


def test_old_names_of_the_checkpoint_module_still_resolve():
    import warnings

    from mqstore.storage import checkpoint
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert checkpoint.write_meta is meta_file.write_meta
        assert checkpoint.ABORT_FILE == "abort" and json.loads("{}") == {}
