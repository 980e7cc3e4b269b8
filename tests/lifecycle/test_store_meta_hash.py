"""A store that lost ``mqstore.json`` learns its string hash from every file written with it.

Real stores (small files, worker processes) written with mmh3 or Java's hash, then
``mqstore.json`` deleted, alone or with ``consumequeue/`` and ``index/``: the hash comes from
the consume queues' tag codes or from the index entries; with neither left, the configured
``store.hash`` is taken and the report says so; files that cannot tell refuse the open.
Afterwards every key and tag query answers exactly (see ``core/lifecycle/store_meta.py``).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from mqstore import Message, MessageStore, PutStatus
from mqstore.errors import StoreCorruptError
from mqstore.testing import open_store
from mqstore.testing.faults import small_store_overrides

TOPIC = "orders"
QUEUES = 2
COUNT = 300
TAGS = ("red", "green", "blue")


def _overrides(hash_kind: str | None) -> dict:
    base = small_store_overrides()
    store = {k: v for k, v in base["store"].items() if k != "hash"}
    if hash_kind is not None:
        store["hash"] = hash_kind
    base["store"] = store
    return base


def _write(root: Path, hash_kind: str, tagged: bool) -> None:
    store = open_store(root, _overrides(hash_kind))
    try:
        assert store.hash_kind == hash_kind
        for i in range(COUNT):
            r = store.put(Message(TOPIC, f"body {i}".encode(), queue_id=i % QUEUES,
                                  tags=TAGS[i % 3] if tagged else None,
                                  keys=[f"k{i}", f"shared{i % 7}"]))
            assert r.status == PutStatus.PUT_OK
        store.wait_dispatched(timeout=30)
    finally:
        store.close()


def _check_answers(store: MessageStore, tagged: bool) -> None:
    store.wait_dispatched(timeout=30)
    for i in range(0, COUNT, 7):
        hits = store.query_by_key(TOPIC, f"k{i}")
        assert [m.body for m in hits] == [f"body {i}".encode()], i
    for j in range(7):
        hits = store.query_by_key(TOPIC, f"shared{j}", max_num=1000)
        assert sorted(m.body for m in hits) == sorted(
            f"body {i}".encode() for i in range(COUNT) if i % 7 == j)
    if not tagged:
        return
    for tag in TAGS:
        got = []
        for queue_id in range(QUEUES):
            offset, end = 0, store.max_offset(TOPIC, queue_id)
            while offset < end:
                res = store.get("g", TOPIC, queue_id, offset, 32, expression=tag)
                got += [m.body for m in res.messages]
                assert res.next_begin_offset > offset
                offset = res.next_begin_offset
        assert sorted(got) == sorted(f"body {i}".encode() for i in range(COUNT)
                                     if TAGS[i % 3] == tag), tag


def _rm(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


CASES = {
    # name: (tagged, derived files deleted besides mqstore.json, the hash learnt from)
    "keys only": (False, [], "index"),
    "tags, consumequeue deleted": (True, ["consumequeue"], "index"),
    "tags, index deleted": (True, ["index"], "tag codes"),
    "tags, consumequeue and index deleted": (True, ["consumequeue", "index"], None),
    "keys only, index deleted": (False, ["index"], None),
}


@pytest.mark.parametrize("hash_kind", ["mmh3", "java"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_lost_mqstore_json_keeps_every_answer(tmp_path, case, hash_kind):
    tagged, deleted, source = CASES[case]
    root = tmp_path / "store"
    _write(root, hash_kind, tagged)
    for name in ["mqstore.json", *deleted]:
        _rm(root / name)
    # The configuration does not name a hash: the default (mmh3) is for new stores.
    expected = hash_kind if source is not None else "mmh3"
    ro = open_store(root, _overrides(None), read_only=True)  # the same inference, writing nothing
    try:
        assert ro.hash_kind == expected
    finally:
        ro.close()
    assert not (root / "mqstore.json").exists()
    store = open_store(root, _overrides(None))
    try:
        assert store.hash_kind == expected
        notes = " | ".join(store.recovery_report.notes)
        if source is not None:
            assert f"show {hash_kind}" in notes and source in notes, notes
        else:
            assert "no file written with one is left" in notes, notes
            assert f"store.hash = {expected}" in notes, notes
        _check_answers(store, tagged)
    finally:
        store.close()
    # Recorded now: the next open reads it and answers the same.
    assert f'"hash": "{expected}"' in (root / "mqstore.json").read_text()
    again = open_store(root, _overrides(None))
    try:
        assert again.hash_kind == expected
        _check_answers(again, tagged)
    finally:
        again.close()


def _poke_tag_codes(root: Path) -> None:
    """Every tagged unit's code replaced by one neither hash gives for the stored tags."""
    for path in (root / "consumequeue" / TOPIC).glob("*/*"):
        data = bytearray(path.read_bytes())
        for at in range(0, len(data), 20):
            phys, size, code = struct.unpack_from(">qiq", data, at)
            if size > 0 and code != 0:
                struct.pack_into(">q", data, at + 12, 424242)
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("hash_kind", ["mmh3", "java"])
def test_files_that_cannot_tell_refuse_the_open(tmp_path, hash_kind):
    root = tmp_path / "store"
    _write(root, hash_kind, tagged=True)
    _rm(root / "mqstore.json")
    _rm(root / "index")
    _poke_tag_codes(root)
    for read_only in (False, True):
        with pytest.raises(StoreCorruptError) as err:
            open_store(root, _overrides(None), read_only=read_only)
        text = str(err.value)
        assert "mqstore.json" in text and "store.hash" in text, text
    assert not (root / "mqstore.json").exists()
    # Naming the hash opens it (the lock was released by the refused opens).
    store = open_store(root, _overrides(hash_kind))
    try:
        assert store.hash_kind == hash_kind
        assert any("set in the configuration" in n for n in store.recovery_report.notes)
    finally:
        store.close()
