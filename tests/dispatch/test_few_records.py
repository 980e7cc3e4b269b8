"""Passes of a few records (a trickle of single puts) are dispatched record by record; larger
ones with array passes. Both write the same consume-queue units and index entries, byte for
byte: built each way from one commit log, the files are equal, and equal RocketMQ's own."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from mqstore import Message, MessageBatch, MessageStore
from mqstore.config import load_config
from mqstore.dispatch import consume_queue_builder
from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.plugins import index_key
from mqstore.storage.consume_queue import ConsumeQueue

ALL, NONE = 1 << 30, 0  # FEW_RECORDS that send every pass one way or the other
FILLER_UNIT = (0).to_bytes(8, "big") + FILLER_SIZE.to_bytes(4, "big") + bytes(8)


def _fill(store) -> None:
    """Records of every kind dispatch tells apart: topics and queues interleaved, tags
    (none, ASCII, not ASCII), UNIQ_KEY and KEYS tokens (repeated, not ASCII, several per
    record), batches across topics, delayed messages (their units carry due times), prepared
    and rolled-back transactions, a topic deleted between its records."""
    store.create_topic("Gone", queues=2)
    for i in range(60):
        topic = ("T", "Orders", "Audit", "Gone")[i % 4]
        props = {"UNIQ_KEY": f"U{i:04d}"} if i % 3 else None
        if i % 11 == 5:
            props = {**(props or {}), "DELAY": "2"}
        r = store.put(Message(topic, b"m%d" % i, tags=(None, "TagA", "标签", "TagB")[i % 4],
                              keys=[f"k{i}", f"shared{i % 5}", f"键{i % 3}"] if i % 4 != 1 else None,
                              properties=props, queue_id=i % 3 if topic != "Gone" else i // 4 % 2,
                              sysflag=(0, 0, 0, 0, 0x4, 0, 0xC)[i % 7] if topic == "T" else 0))
        assert r.status.name == "PUT_OK"
        if i == 30:
            store.delete_topic("Gone")
            store.create_topic("Gone", queues=2)
    for b in range(4):
        r = store.put_batch([Message(("Orders", "Audit", "T")[j % 3], b"b%d-%d" % (b, j),
                                     tags="TagA" if j % 2 else None,
                                     keys=[f"bk{b}-{j}", f"shared{j % 5}"] if j % 4 else None,
                                     properties={"UNIQ_KEY": f"B{b}{j:03d}"} if j % 3 else None,
                                     queue_id=j % 3) for j in range(40)])
        assert r.status.name == "PUT_OK"
    r = store.put_batch(MessageBatch(bodies=[b"c%d" % j for j in range(30)], topic="Orders",
                                     queue_ids=[j % 3 for j in range(30)], tags="Col",
                                     keys=[f"ck{j}" for j in range(30)]))
    assert r.status.name == "PUT_OK"
    store.wait_dispatched()


def _derived(root) -> dict:
    """Every consume-queue file by path, every index file in name order."""
    queues = {str(p.relative_to(root)): p.read_bytes()
              for p in sorted((root / "consumequeue").rglob("*")) if p.is_file()}
    index = [p.read_bytes() for p in sorted((root / "index").iterdir()) if p.name.isdigit()]
    return {"consumequeue": queues, "index": index}


def _count_few(monkeypatch) -> dict:
    """Patch both dispatchers to count the passes each took record by record."""
    taken = {"queues": 0, "keys": 0}
    builder_few = consume_queue_builder.ConsumeQueueBuilder._dispatch_few
    index_few = index_key.KeyIndex._index_few

    def queues(self, batch):
        taken["queues"] += 1
        return builder_few(self, batch)

    def keys(self, batch, rows):
        taken["keys"] += 1
        return index_few(self, batch, rows)
    monkeypatch.setattr(consume_queue_builder.ConsumeQueueBuilder, "_dispatch_few", queues)
    monkeypatch.setattr(index_key.KeyIndex, "_index_few", keys)
    return taken


def _paths(monkeypatch, records: int, keys: int = 0) -> None:
    monkeypatch.setattr(consume_queue_builder, "FEW_RECORDS", records)
    monkeypatch.setattr(index_key, "FEW_RECORDS", records)
    monkeypatch.setattr(index_key, "FEW_KEYS", keys)


# Passes of a dozen records or so; segments of 8 KiB, index files of 48 entries: the log
# spans several segments, the index rolls to new files.
SMALL = {"dispatch": {"batch_bytes": 4096}, "commit_log": {"segment_bytes": 8192},
         "index": {"max_hash_slots": 8, "max_index_entries": 48}}
# (records, keys): every pass with arrays; record by record, entries with arrays; all one
# by one.
PATHS = [(NONE, 0), (ALL, 0), (ALL, ALL)]


@pytest.mark.loops("thread")  # the dispatchers patched here run in this process
@pytest.mark.parametrize("hash_kind", ["mmh3", "java"])
@pytest.mark.parametrize("dropped", [0, 2])
def test_few_record_passes_write_the_array_paths_bytes(make_store, tmp_path, monkeypatch,
                                                       hash_kind, dropped):
    """Built from one log each way, the files are equal; with the log's first segments gone
    (as cleanup leaves it) every queue starts past 0, fillers ahead of its first unit."""
    taken = _count_few(monkeypatch)
    _paths(monkeypatch, NONE)
    source = make_store(SMALL, root=tmp_path / "source", hash_kind=hash_kind)
    _fill(source)
    source.close()
    assert taken == {"queues": 0, "keys": 0}
    segments = sorted((tmp_path / "source" / "commitlog").iterdir())
    assert len(segments) > dropped + 2
    built = []
    for records, keys in PATHS:
        _paths(monkeypatch, records, keys)
        root = tmp_path / f"few-{records}-{keys}"
        shutil.copytree(tmp_path / "source", root)
        shutil.rmtree(root / "consumequeue")
        shutil.rmtree(root / "index")
        for segment in segments[:dropped]:
            (root / "commitlog" / segment.name).unlink()
        make_store(SMALL, root=root, hash_kind=hash_kind).close()
        built.append(_derived(root))
    assert taken["queues"] >= 5  # re-dispatched in passes of a few records each
    assert taken["keys"] >= 5 if hash_kind == "mmh3" else taken["keys"] == 0
    assert len(built[0]["index"]) > 3
    if dropped:
        heads = [units[:CQ_UNIT_SIZE] for units in built[0]["consumequeue"].values()]
        assert FILLER_UNIT in heads
    else:
        assert built[0] == _derived(tmp_path / "source")
        assert len(built[0]["consumequeue"]) >= 12
    assert built[1] == built[0]
    assert built[2] == built[0]


@pytest.mark.loops("thread")
def test_few_record_passes_rebuild_rocketmqs_consume_queues(rocketmq_dir, tmp_path, monkeypatch):
    """RocketMQ 4.9.8's consume queues, deleted and rebuilt from its commit log in passes of
    a few records each (30-unit files, as it wrote them), are its bytes again."""
    taken = _count_few(monkeypatch)
    root = tmp_path / "store"
    shutil.copytree(rocketmq_dir, root)
    theirs = _derived(root)["consumequeue"]
    assert len(theirs) > 4
    shutil.rmtree(root / "consumequeue")
    config = load_config(overrides={"plugins": {"load_entry_points": False},
                                    "dispatch": {"worker": "thread", "batch_bytes": 4096},
                                    "consume_queue": {"file_units": 30}})
    MessageStore.open(root, config).close()
    assert taken["queues"] > 3
    assert _derived(root)["consumequeue"] == theirs


@pytest.mark.parametrize("first", [0, 5])
def test_put_few_skips_and_fills_as_put_units(tmp_path, first):
    """Units already there (by commit-log end or by queue offset) are skipped, a gap gets
    fillers, a queue whose first unit is past 0 is pre-filled: the same counts and files
    either way. Units here: (commit-log offset, size, tags code), 100 bytes per record."""
    unit = lambda n: (100 * n, 100, n * 7 - 20)  # noqa: E731
    calls = [(first, [unit(n) for n in range(4)]),
             (first + 2, [unit(n) for n in range(2, 7)]),  # 2, 3 built already: skipped
             (first + 9, [unit(n) for n in range(5, 9)]),  # 7, 8 at 11, 12: fillers at 7..10
             (first + 7, [unit(n) for n in range(7, 9)]),  # ends not past max_phys: none
             (first + 5, [unit(n) for n in range(9, 11)]),  # offsets 5, 6 taken: none
             (first + 12, [unit(n) for n in range(12, 14)])]  # offset 12 taken: 13 only
    files, counts = {}, {}
    for kind in ("units", "few"):
        cq = ConsumeQueue(str(tmp_path / kind), "T", 0, 8 * CQ_UNIT_SIZE)
        got = []
        for qoff, units in calls:
            if kind == "few":
                got.append(cq.put_few(qoff, units))
            else:
                got.append(cq.put_units(qoff, np.array(units, dtype=[
                    ("phys_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])))
        counts[kind] = got
        files[kind] = {p.name: p.read_bytes() for p in sorted(
            (tmp_path / kind / "consumequeue" / "T" / "0").iterdir())}
        assert cq.max_offset == first + 14 and cq.max_phys == 1400
        cq.close()
    assert counts["few"] == counts["units"] == [4, 3, 2, 0, 0, 1]
    assert files["few"] == files["units"] and len(files["few"]) == -(-(first + 14) // 8)
