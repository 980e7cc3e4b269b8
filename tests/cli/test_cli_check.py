"""``mqstore check`` finds each damage class with its file and offset, and ``--fix`` repairs
it with the store's own recovery and rebuild; run as subprocesses on copies of one store."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from mqstore import Message, MessageBatch, MessageStore, load_config
from mqstore.format.record import header_struct
from cli_support import SMALL_CONFIG, mqstore, mqstore_json, mqstore_tty

pytestmark = pytest.mark.usefixtures("no_plugin_env")
SEGMENT = 65536
COUNT = 600
FIRST = f"commitlog/{0:020d}"
SECOND = f"commitlog/{SEGMENT:020d}"


@pytest.fixture(scope="module")
def base(tmp_path_factory, config):
    """600 keyed messages over 4 queues and two segments; returns (root, their put results)."""
    root = tmp_path_factory.mktemp("base") / "store"
    cfg = load_config(config).replace(dispatch={"worker": "thread"}, flush={"worker": "thread"})
    with MessageStore.open(root, config=cfg) as store:
        result = store.put_batch(MessageBatch(
            topic="orders", bodies=[b"body-%04d" % i for i in range(COUNT)],
            queue_ids=[i % 4 for i in range(COUNT)], tags="paid",
            keys=[[f"k{i}"] for i in range(COUNT)]))
        end = store.max_phys_offset
    return root, result, end


@pytest.fixture
def store(base, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(base[0], root)
    return root


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def problems(report: dict) -> list[tuple]:
    return [(p["kind"], p["file"], p["offset"], p["position"]) for p in report["problems"]]


def fix(root, config) -> dict:
    out = mqstore_json("check", root, "-c", config, "--fix")
    assert out["clean"] and out["after"]["clean"] and out["after"]["problems"] == []
    return out


def test_torn_tail_after_a_crash_is_cut(store, base, config):
    _root, result, end = base
    first = bytes((store / FIRST).read_bytes()[:int(result.sizes[0])])
    with open(store / SECOND, "r+b") as f:  # a crash mid-append: half a record past the end
        f.seek(end - SEGMENT)
        f.write(first[:60])
    (store / "abort").write_text(str(dead_pid()))
    found = mqstore_json("check", store, "-c", config, check=1)
    assert problems(found) == [("torn-tail", SECOND, end - SEGMENT, end),
                               ("abort", "abort", 0, None)]
    assert found["records"] == COUNT and found["crc_bad"] == 0
    out = fix(store, config)
    assert any(a.startswith("cut a torn tail of ") and f"at commit-log offset {end}" in a
               for a in out["actions"]), out["actions"]
    assert "closed cleanly: the stale abort marker is gone" in out["actions"]
    assert out["after"]["records"] == COUNT and not (store / "abort").exists()


def test_flipped_bit_is_quarantined_and_everything_after_kept(store, base, config):
    _root, result, _end = base
    victim = 7  # orders/3 offset 1
    phys, size = int(result.phys_offsets[victim]), int(result.sizes[victim])
    body_at = phys + header_struct(False, False).size
    with open(store / FIRST, "r+b") as f:
        f.seek(body_at)
        byte = f.read(1)
        f.seek(body_at)
        f.write(bytes([byte[0] ^ 0x10]))
    found = mqstore_json("check", store, "-c", config, check=1)
    assert found["crc_bad"] == 1 and found["records"] == COUNT - 1
    got = problems(found)
    assert got[0] == ("record", FIRST, phys, phys)
    assert found["problems"][0]["detail"].startswith("damaged record (body CRC mismatch)")
    assert ("consume-queue", "consumequeue/orders/3/00000000000000000000", 20, 1) in got
    # its key's entry now names a record the walk could not read
    assert [(p[0], p[3]) for p in got if p[0] == "index"] == [("index", phys)]
    out = fix(store, config)
    assert f"quarantined commit-log bytes [{phys}, {phys + size}) (body CRC mismatch); the " \
           f"original bytes are in {store}/quarantine/{phys:020d}" in out["actions"]
    assert out["after"]["records"] == COUNT  # 599 intact records and the quarantine record
    lookup = mqstore_json("query", store, "key", "orders", f"k{victim + 4}", "-c", config)
    assert [m["queue_offset"] for m in lookup["messages"]] == [2]  # later records keep theirs


def test_deleted_consume_queue_is_rebuilt(store, config):
    shutil.rmtree(store / "consumequeue" / "orders" / "2")
    found = mqstore_json("check", store, "-c", config, check=1)
    assert problems(found) == [("consume-queue", "consumequeue/orders/2", 0, 0)]
    assert found["problems"][0]["detail"] == \
        f"consume queue orders/2 is missing: {COUNT // 4} record(s) have no unit"
    out = fix(store, config)
    assert "removed consumequeue/ to rebuild it from the commit log" in out["actions"]
    stats = mqstore_json("stats", store, "-c", config)
    assert [(q["queue_id"], q["max_offset"]) for q in stats["topics"][0]["queues"]] == [
        (q, COUNT // 4) for q in range(4)]


def test_problems_on_a_narrow_terminal_keep_their_file_whole(store, config):
    (store / "consumequeue" / "orders" / "3" / f"{0:020d}").unlink()
    status, shown = mqstore_tty("check", store, "-c", config, columns=60)
    assert status == 1
    rows = [line for line in shown.splitlines() if "consume-queue" in line]
    assert rows and all("consumequeue/orders/3/00000000000000000000" in row for row in rows)


def test_deleted_index_is_rebuilt(store, base, config):
    _root, result, _end = base
    shutil.rmtree(store / "index")
    found = mqstore_json("check", store, "-c", config, check=1)
    assert problems(found) == [("index", "index", 0, 0)]
    assert found["problems"][0]["detail"] == (
        f"keys of {COUNT} record(s) at commit-log offsets 0..{int(result.phys_offsets[-1])}: "
        f"index/ holds no file")
    fix(store, config)
    hit = mqstore_json("query", store, "key", "orders", "k599", "-c", config)["messages"]
    assert [m["phys_offset"] for m in hit] == [int(result.phys_offsets[-1])]


@pytest.mark.slow
def test_stale_abort_marker(store, base, config):
    _root, result, _end = base
    (store / "abort").write_text(str(dead_pid()))
    found = mqstore_json("check", store, "-c", config, check=1)
    assert problems(found) == [("abort", "abort", 0, None)]
    human = mqstore("check", store, "-c", config, check=1).stdout
    assert "1 problem(s)" in human and "abort marker left by process" in human
    out = fix(store, config)
    # The close left mqstore.queued naming the last record: the walk starts there.
    assert out["actions"][0] == ("recovered after an unclean exit, from commit-log offset "
                                 f"{int(result.phys_offsets[-1])}")
    assert not (store / "abort").exists()
    assert mqstore("check", store, "-c", config).stdout.rstrip().endswith(": clean")


def _crc_store(tmp_path):
    """(config path, config, root, put result) of 50 messages written with the record CRC."""
    config = tmp_path / "crc.yaml"
    config.write_text(SMALL_CONFIG.replace("{segment_bytes: 65536}",
                                           "{segment_bytes: 65536, record_crc: true}"))
    root = tmp_path / "store"
    cfg = load_config(str(config)).replace(dispatch={"worker": "thread"},
                                           flush={"worker": "thread"})
    with MessageStore.open(root, config=cfg) as store:
        result = store.put_batch(MessageBatch(topic="orders", bodies=[b"b%03d" % i for i in
                                                                     range(50)], queue_ids=0))
    return config, cfg, root, result


def test_a_header_flip_is_found_in_a_store_written_with_the_record_crc(tmp_path):
    """Outside the body CRC's reach (BORNTIMESTAMP), the record CRC finds it; and a record
    whose CRC property was overwritten is found too, since the store wrote one into each."""
    config, cfg, root, result = _crc_store(tmp_path)
    flipped, wiped = (int(result.phys_offsets[i]) for i in (7, 20))
    with open(root / FIRST, "r+b") as f:
        f.seek(flipped + 40)
        byte = f.read(1)
        f.seek(flipped + 40)
        f.write(bytes([byte[0] ^ 0x01]))
        f.seek(wiped + int(result.sizes[20]) - 20)
        f.write(bytes(20))
    found = mqstore_json("check", root, "-c", config, check=1)
    assert found["crc_bad"] == 2 and found["records"] == 48
    details = {p["offset"]: p["detail"] for p in found["problems"] if p["kind"] == "record"}
    assert details[flipped].startswith("damaged record (record CRC mismatch)")
    assert details[wiped].startswith("damaged record (record CRC property missing)")


def test_fix_quarantines_a_record_whose_crc_property_was_overwritten(tmp_path):
    config, cfg, root, result = _crc_store(tmp_path)
    wiped, size = int(result.phys_offsets[20]), int(result.sizes[20])
    with open(root / FIRST, "r+b") as f:
        f.seek(wiped + size - 20)
        f.write(bytes(20))
    out = fix(root, config)
    assert any(a.startswith(f"quarantined commit-log bytes [{wiped}, {wiped + size}) (record "
                            f"CRC property missing)") for a in out["actions"]), out["actions"]
    with MessageStore.open(root, config=cfg) as store:
        bodies = [m.body for m in store.get("g", "orders", 0, 0, 64).messages]
        while len(bodies) < 49:
            bodies += [m.body for m in store.get("g", "orders", 0, len(bodies) + 1, 64).messages]
        assert bodies == [b"b%03d" % i for i in range(50) if i != 20]


@pytest.mark.parametrize("evidence", ["clean close", "queue files only"])
def test_fix_after_rot_in_the_newest_records_gives_no_offset_out_twice(store, base, config,
                                                                        evidence):
    """Issue 24, point 1: the rebuild behind ``--fix`` quarantines the three newest records
    and rebuilds the queues from the log; their offsets stay taken (fillers), so the next
    puts go on above them. With no marker and no manifest (a crash, then the manifest lost)
    only the consume queues know their ends: the repair records them before it removes
    them."""
    _root, result, _end = base
    newest = range(COUNT - 3, COUNT)
    for i in newest:
        at = int(result.phys_offsets[i]) - SEGMENT + header_struct(False, False).size
        with open(store / SECOND, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x10]))
    if evidence == "queue files only":
        (store / "mqstore.clean").unlink()
        (store / "config" / "mqstore_queues.json").unlink()
        (store / "abort").write_text(str(dead_pid()))
    out = fix(store, config)
    with MessageStore.open(store, config=load_config(config)) as reopened:
        for q in range(4):
            assert reopened.max_offset("orders", q) == COUNT // 4
        for i in newest:
            got = reopened.get("g", "orders", i % 4, int(result.queue_offsets[i]), 1)
            assert got.messages == []
        for q in range(4):
            put = reopened.put(Message("orders", b"after-%d" % q, queue_id=q))
            assert put.queue_offset == COUNT // 4
        reopened.wait_dispatched(timeout=30)
        for q in range(4):
            got = reopened.get("g", "orders", q, COUNT // 4, 1).messages
            assert [m.body for m in got] == [b"after-%d" % q]
    held = [a for a in out["actions"] if a.startswith("queue offsets ")]
    assert held == [f"queue offsets {COUNT // 4 - 1} of orders/{i % 4} lost their messages; "
                    f"fillers hold them, later offsets are kept" for i in newest], out["actions"]
def test_the_end_of_a_full_segments_data_is_found_in_bounded_memory():
    """The walk looks for where a segment's data ends; a segment of non-zero bytes to its
    end must not cost an index array eight times its size (a 1 GiB segment: 8 GiB)."""
    import tracemalloc
    from types import SimpleNamespace

    from mqstore.ops.checking.log_walk import _nonzero_end
    size = 32 << 20
    data = bytearray(b"\x01" * size)
    data[-5:] = bytes(5)  # the data ends 5 bytes before the segment does
    seg = SimpleNamespace(mm=data, data_end=lambda: size)
    tracemalloc.start()
    try:
        assert _nonzero_end(seg, 0) == size - 5
        assert _nonzero_end(seg, size - 3) == size - 3  # nothing at or after: begin
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # windows' index arrays, not the segment's (256 MiB)


@pytest.mark.parametrize("flip", [0xFF, 0x01], ids=["not-utf8", "another-digit"])
def test_fix_reindexes_a_record_whose_key_changed_after_it_was_indexed(tmp_path, config, flip):
    """No CRC covers a record's properties (as in RocketMQ), so a flipped byte in the last
    record's UNIQ_KEY reads as another key: check finds the index disagreeing with the
    record, and --fix re-indexes the record as it now reads (a byte that is no UTF-8 reads as
    U+FFFD, as every read decodes it), says so, and check is clean after it. The message is
    found by the key it now shows."""
    root = tmp_path / "store"
    mqstore("produce", root, "-c", config, "-t", "T", "-l", "-",
            input="".join(f"m{i}\n" for i in range(50)))
    segment = root / FIRST
    data = segment.read_bytes()
    end = len(data.rstrip(b"\0"))
    with open(segment, "r+b") as f:
        f.seek(end - 3)
        f.write(bytes([data[end - 3] ^ flip]))
    found = mqstore_json("check", root, "-c", config, check=1)
    [missing, wrong] = found["problems"]
    phys = missing["position"]
    assert (missing["kind"], missing["file"], wrong["kind"], wrong["position"]) == (
        "index", "index", "index", phys)
    assert missing["detail"] == (f"keys of 1 record(s) at commit-log offsets {phys}..{phys}: "
                                 f"not in the index")
    out = fix(root, config)
    assert (f"re-indexed the record at commit-log offset {phys} as it now reads: its keys "
            f"changed after it was indexed (no CRC covers its properties); nothing was "
            f"quarantined") in out["actions"], out["actions"]
    assert mqstore_json("check", root, "-c", config)["clean"]
    [shown] = mqstore_json("query", root, "offset", phys, "-c", config)["messages"]
    uniq = shown["uniq_key"]
    assert ("\ufffd" in uniq) == (flip == 0xFF)
    # (another record may hold that key too: the flip can make one UNIQ_KEY another's)
    found_by_key = mqstore_json("query", root, "key", "T", uniq, "-c", config)["messages"]
    assert phys in [m["phys_offset"] for m in found_by_key]
