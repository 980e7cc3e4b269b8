"""``mqstore consume``, and consumer groups in ``stats`` and ``/metrics``, as real processes.

Every command runs as a subprocess on a store made by ``init`` and ``produce``; offsets are
checked through ``stats --json`` (the operator's view) and the RocketMQ offset file itself.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli_support import SMALL_CONFIG, env, error_line, mqstore, mqstore_json, mqstore_tty
from mqstore.testing import patience
from mqstore.testing.consumer_proc import ConsumerProcess
from serve_support import STOP_TIMEOUT_S, scrape, start
from paths import REPO

pytestmark = pytest.mark.usefixtures("no_plugin_env")
TOPIC = "orders"
PRODUCED = 10
FOLLOW_SEES_WITHIN_S = 5.0
STARTUP_TIMEOUT_S = 60


@pytest.fixture
def store(tmp_path, config):
    """A store with PRODUCED messages of TOPIC over the selector's queues; returns the root
    and ``{(queue_id, queue_offset): body}`` of what was put."""
    root = tmp_path / "store"
    mqstore("init", root, "-c", config)
    put = produce(root, config, *[f"m{i}" for i in range(PRODUCED)])
    assert len({q for q, _offset in put}) > 1  # several queues: commits are per queue
    return root, put


def produce(root, config, *bodies, topic=TOPIC, options=()) -> dict:
    out = mqstore_json("produce", root, "-c", config, "-t", topic, *options, *bodies)
    return {(m["queue_id"], m["queue_offset"]): body for m, body in zip(out["messages"], bodies)}


def consume(root, config, group, *options) -> list[dict]:
    """``mqstore consume --json``: one JSON object per line."""
    proc = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", group, *options, "--json")
    return [json.loads(line) for line in proc.stdout.splitlines()]


def positions(messages) -> list[tuple[int, int]]:
    return [(m["queue_id"], m["queue_offset"]) for m in messages]


def groups(root, config) -> dict[str, dict]:
    """Each group's entry for TOPIC in ``stats --json``, by group name."""
    return {g["group"]: g for g in mqstore_json("stats", root, "-c", config)["consumers"]
            if g["topic"] == TOPIC}


def group_stats(root, config, group) -> dict | None:
    """The group's entry (None: the store knows no such group)."""
    return groups(root, config).get(group)


def committed(root, config, group) -> dict[int, int | None]:
    return {q["queue_id"]: q["committed_offset"]
            for q in group_stats(root, config, group)["queues"]}


@pytest.mark.slow
def test_n_commits_exactly_those_and_the_next_run_resumes_after_them(store, config):
    root, put = store
    first = consume(root, config, "billing", "--from", "first", "-n", 4)
    assert len(first) == 4
    # 10 produced, 4 consumed: lag 6, and each queue committed just past what it printed
    billing = group_stats(root, config, "billing")
    assert billing["lag"] == PRODUCED - 4
    printed = {q: sorted(o for qq, o in positions(first) if qq == q) for q, _ in put}
    for q in billing["queues"]:
        mine = printed[q["queue_id"]]
        assert mine == list(range(len(mine)))  # each queue from its first message, in order
        assert q["committed_offset"] == len(mine)
        assert q["lag"] == q["max_offset"] - len(mine)
        assert (q["oldest_unconsumed_age_ms"] > 0) == (q["lag"] > 0)
    rest = consume(root, config, "billing")  # no --from: a group with offsets resumes
    assert len(rest) == PRODUCED - 4
    seen = positions(first) + positions(rest)
    assert sorted(seen) == sorted(put)  # none twice, none skipped
    assert {(m["queue_id"], m["queue_offset"]): m["body"] for m in first + rest} == put
    assert consume(root, config, "billing") == []
    assert group_stats(root, config, "billing")["lag"] == 0
    table = mqstore("stats", root, "-c", config).stdout
    assert "consumers" in table and "billing" in table


@pytest.mark.slow
def test_json_lines_are_the_messages_query_prints(store, config):
    root, put = store
    lines = consume(root, config, "scripts", "--from", "first", "-n", 2)
    for m in lines:
        (same,) = mqstore_json("query", root, "offset", m["phys_offset"], "-c", config)["messages"]
        assert m == same
    assert [m["body"] for m in lines] == [put[p] for p in positions(lines)]


def test_table_for_people(store, config):
    root, put = store
    proc = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "people", "--from", "first",
                   "-n", 3, "--format", "table")
    for column in ("queue", "offset", "msg id", "uniq key", "tags", "keys", "properties",
                   "body"):
        assert column in proc.stdout
    assert sum(body in proc.stdout for body in put.values()) == 3
    assert "3 message(s) consumed by group 'people'; committed" in proc.stderr
    assert group_stats(root, config, "people")["lag"] == PRODUCED - 3


def test_values_when_piped_json_and_table_on_request(tmp_path, config):
    """Like kafka-console-consumer: raw bodies, a line each, when the output is a pipe."""
    root = tmp_path / "store"
    long_body = "x" * 300 + " the end"
    bodies = ["plain", long_body, "with\ttab", "\x1b[31mred"]
    produce(root, config, *bodies, options=("-q", "0", "-p", "region=eu"))
    piped = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "pipe", "--from", "first")
    assert piped.stdout == "".join(b + "\n" for b in bodies)  # whole, byte for byte
    assert piped.stderr == "4 message(s) consumed by group 'pipe'; committed\n"
    as_json = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "j", "--from", "first",
                      "--format", "json").stdout.splitlines()
    assert [json.loads(line)["body"] for line in as_json] == bodies
    assert mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "j2", "--from", "first",
                   "--json").stdout.splitlines() == as_json  # --json: the same
    clash = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "x", "--json", "--format",
                    "table", check=2)
    assert "--json and --format table say different things" in clash.stderr
    # a table holds the whole body and every property, and never wraps an id
    table = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "t", "--from", "first",
                    "--format", "table").stdout
    assert "".join(line.split("│")[-2].strip() for line in table.splitlines()
                   if line.startswith("│")).count(long_body) == 1
    ids = [(m["msg_id"], m["uniq_key"]) for m in map(json.loads, as_json)]
    for msg_id, uniq_key in ids:
        assert msg_id in table and uniq_key in table
    assert table.count("region=eu") == 4
    # a body that would drive the terminal (an escape sequence) is shown as base64
    assert "\x1b" not in table and "base64:G1szMW1yZWQ=" in table


def test_a_table_on_a_narrow_terminal_keeps_ids_whole(tmp_path, config):
    """On a terminal the default is a table; at 80 columns the ids stay on one line each."""
    root = tmp_path / "store"
    (put,) = produce(root, config, "a body long enough to fold " * 4,
                     options=("-q", "0", "-p", "note=" + "n" * 60)).keys()
    status, shown = mqstore_tty("consume", root, "-c", config, "-t", TOPIC, "-g", "tty",
                                "--from", "first", columns=80)
    assert status == 0, shown
    (m,) = consume(root, config, "tty-json", "--from", "first")
    rows = [line for line in shown.splitlines() if m["msg_id"] in line]
    assert len(rows) == 1 and m["uniq_key"] in rows[0]
    assert "n" * 10 in shown and "1 message(s) consumed by group 'tty'; committed" in shown


def test_follow_waits_for_a_topic_that_does_not_exist_yet(tmp_path, config):
    root = tmp_path / "store"
    mqstore("init", root, "-c", config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqstore.cli", "consume", str(root), "-c", config, "-t", TOPIC,
         "-g", "early", "--follow", "--format", "value"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
        start_new_session=True)
    try:
        _wait_for_member(root, "early")
        produce(root, config, "first one")
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
        assert lines.get(timeout=STARTUP_TIMEOUT_S) == "first one\n"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(STOP_TIMEOUT_S)
    assert code == 0
    assert proc.stderr.read().splitlines() == [
        f"topic '{TOPIC}' does not exist yet: waiting for its first message",
        "1 message(s) consumed by group 'early'; committed"]


def _wait_for_member(root: Path, group: str) -> None:
    """Until the group's consumer has joined (its membership directory exists)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    members = root / "consumer" / "groups" / group / TOPIC / "members"
    while not (members.is_dir() and any(members.iterdir())):
        assert time.monotonic() < deadline, "the consumer never joined its group"
        time.sleep(0.05)


def _timeless(stats: dict) -> dict:
    """``stats`` without the ages, which grow between two runs."""
    return json.loads(json.dumps(stats), object_hook=lambda d: {
        k: v for k, v in d.items() if k != "oldest_unconsumed_age_ms"})


def test_stats_of_one_group(store, config):
    root, put = store
    consume(root, config, "billing", "--from", "first", "-n", 4)
    consume(root, config, "audit", "--from", "first")
    one = mqstore_json("stats", root, "-c", config, "--group", "billing")
    everyone = mqstore_json("stats", root, "-c", config)["consumers"]
    assert _timeless(one) == _timeless({"consumers": [g for g in everyone
                                                      if g["group"] == "billing"]})
    assert one["consumers"][0]["lag"] == PRODUCED - 4
    table = mqstore("stats", root, "-c", config, "--group", "billing").stdout
    assert table.splitlines()[0].rstrip() == "consumer group billing"
    assert table.splitlines()[-1] == f"lag {PRODUCED - 4} message(s) in 1 topic(s)"
    assert "audit" not in table
    missing = mqstore("stats", root, "-c", config, "--group", "nobody", check=1)
    assert (missing.stdout, missing.stderr) == (
        "", "consumer group 'nobody' has no offsets in this store (its groups: audit, "
            "billing)\n")


@pytest.mark.slow
def test_filters_by_tag_and_sql(tmp_path, config):
    root = tmp_path / "filtered"
    paid = produce(root, config, "p1", "p2", "p3", options=("--tags", "paid", "-p", "region=eu"))
    new = produce(root, config, "n1", "n2", options=("--tags", "new", "-p", "region=us"))
    by_tag = consume(root, config, "tagged", "--from", "first", "-e", "paid || refunded")
    assert sorted(m["body"] for m in by_tag) == sorted(paid.values())
    by_sql = consume(root, config, "sql", "--from", "first", "--sql", "region = 'us'")
    assert sorted(m["body"] for m in by_sql) == sorted(new.values())
    # what the filters passed over is not for these groups: consumed, nothing left behind
    found = groups(root, config)
    assert (found["tagged"]["lag"], found["sql"]["lag"]) == (0, 0)


@pytest.mark.slow
def test_no_commit_peeks_from_the_committed_offsets_and_writes_nothing(store, config):
    root, put = store
    # A group new to the topic starts where --from says; nothing of it is recorded anywhere.
    peeked = consume(root, config, "peeker", "--from", "first", "--no-commit")
    assert sorted(positions(peeked)) == sorted(put)
    assert consume(root, config, "peeker", "--no-commit") == []  # --from last: only new ones
    assert not (root / "config" / "consumerOffset.json").exists()
    assert not (root / "consumer" / "groups").exists()
    assert group_stats(root, config, "peeker") is None
    # A group under way, and a queue it has no offset for yet (made after its commit).
    consume(root, config, "billing", "--from", "first", "-n", 3)
    late = produce(root, config, "late", options=("-q", 7))
    before = committed(root, config, "billing")
    assert before[7] is None and sum(o for o in before.values() if o is not None) == 3
    state = _group_state(root)
    again = consume(root, config, "billing", "--no-commit")
    assert _group_state(root) == state  # no offset, no membership file, nothing touched
    # exactly from each committed offset; the new queue from its first message
    assert sorted(positions(again)) == sorted(
        (q, o) for q, o in {**put, **late} if o >= (before[q] or 0))
    assert len(again) == PRODUCED - 3 + 1 and list(late)[0] in positions(again)
    assert committed(root, config, "billing") == before
    # ... so a committing run gets exactly what the peek showed, in the same order
    assert consume(root, config, "billing") == again


@pytest.mark.slow
def test_a_peek_beside_a_live_member_takes_none_of_its_queues(store, config):
    """A peek does not join the group: the live instance (another process) keeps every queue
    while the peek follows and after it ends, the group's offsets and membership files stay
    as they were, and the peek reads from the committed offsets and is woken by dispatch."""
    root, put = store
    consume(root, config, "billing", "--from", "first", "-n", 3)
    before = committed(root, config, "billing")
    member = ConsumerProcess(root, "billing", TOPIC, "--no-commit", "--rebalance-ms", "100")
    peek = None
    try:
        assert member.wait_for(lambda p: p.assignment is not None), member.errors()
        everything = sorted({q for q, _ in put})
        assert member.assignment == everything  # the lone instance owns every queue
        state = _group_state(root)
        peek = subprocess.Popen(
            [sys.executable, "-m", "mqstore.cli", "consume", str(root), "-c", config, "-t",
             TOPIC, "-g", "billing", "--no-commit", "--follow", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
            start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_read_lines, args=(peek.stdout, lines), daemon=True).start()
        backlog = sorted((q, o) for q, o in put if o >= before[q])
        got = _take(lines, len(backlog), STARTUP_TIMEOUT_S)
        assert sorted(positions(got)) == backlog  # exactly from the committed offsets
        late = produce(root, config, "late")  # the following peek is woken for it
        (seen,) = _take(lines, 1, FOLLOW_SEES_WITHIN_S)
        assert (seen["body"], positions([seen])) == ("late", list(late))
        # Six more 100 ms polls of the member, five rebalance checks at least, the peek still
        # running.
        naps = member.naps()
        assert member.wait_for(lambda p: p.naps() >= naps + 6), member.errors()
        assert peek.poll() is None
        assert _assignments(member) == [everything]
        assert _group_state(root) == state  # no seat, no queue lock, no offset for the peek
    finally:
        if peek is not None:
            os.killpg(peek.pid, signal.SIGTERM)
            assert peek.wait(STOP_TIMEOUT_S) == 0, peek.stderr.read()
        # A leave would have made the member look again within a poll or two.
        naps = member.naps()
        looked_again = member.wait_for(lambda p: p.naps() >= naps + 3)
        assignments, after = _assignments(member), _group_state(root)
        assert member.stop() == 0, member.errors()
    assert looked_again
    assert assignments == [everything]
    assert after == state
    assert committed(root, config, "billing") == before


def _assignments(member: ConsumerProcess) -> list[list[int]]:
    """Every assignment the member printed: one unless it rebalanced."""
    return [json.loads(rest) for kind, rest in list(member.lines) if kind == "assigned"]


def _group_state(root: Path) -> dict:
    """Every file and directory under consumer/groups (with its size and mtime) and the bytes
    of the offset files: what a peek must leave as it found."""
    out = {}
    groups_dir = root / "consumer" / "groups"
    for path in sorted(groups_dir.rglob("*")) if groups_dir.exists() else ():
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    for name in ("consumerOffset.json", "consumerOffset.json.journal"):
        path = root / "config" / name
        out[name] = path.read_bytes() if path.exists() else None
    return out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_follow_sees_new_messages_and_stops_cleanly(store, config, signum):
    root, put = store
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqstore.cli", "consume", str(root), "-c", config, "-t", TOPIC,
         "-g", "tail", "--from", "first", "--follow", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
        start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        existing = _take(lines, PRODUCED, STARTUP_TIMEOUT_S)
        assert sorted(positions(existing)) == sorted(put)
        # produced afterwards by another process, a writer beside the read-only consumer
        late = produce(root, config, "late")
        produced_at = time.monotonic()
        (seen,) = _take(lines, 1, FOLLOW_SEES_WITHIN_S)
        assert time.monotonic() - produced_at < patience(FOLLOW_SEES_WITHIN_S)
        assert (seen["body"], positions([seen])) == ("late", list(late))
    finally:
        os.killpg(proc.pid, signum)  # the whole group, as Ctrl-C in a terminal sends SIGINT
        code = proc.wait(STOP_TIMEOUT_S)
    stderr = proc.stderr.read()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    # it committed everything it printed: nothing left, and a new run gets nothing
    tail = group_stats(root, config, "tail")
    assert tail["lag"] == 0
    assert {q["queue_id"]: q["committed_offset"] for q in tail["queues"]} == {
        q["queue_id"]: q["max_offset"] for q in tail["queues"]}
    assert consume(root, config, "tail") == []


@pytest.mark.slow
def test_bad_usage_exits_2_naming_the_value(store, config):
    root, _put = store
    bad = mqstore("consume", root, "-t", TOPIC, "-g", "g", "--from", "yesterday", check=2)
    assert "'--from'" in error_line(bad) and "'yesterday'" in error_line(bad)
    early = mqstore("consume", root, "-t", TOPIC, "-g", "g", "--from", "1969-12-31", check=2)
    assert "'1969-12-31' is before 1970-01-01" in error_line(early)
    both = mqstore("consume", root, "-t", TOPIC, "-g", "g", "-e", "paid", "--sql", "a = 1",
                   check=2)
    assert "mutually exclusive" in error_line(both)
    for peek in ((), ("--no-commit",)):  # a filter's syntax error is bad input, not a failure
        sql = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "g", "--sql", "a = = 1",
                      *peek, check=2)
        assert error_line(sql).startswith("Error: invalid SQL92 expression 'a = = 1' at line 1")
    group = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "no spaces", check=2)
    assert "group 'no spaces' must match" in error_line(group)
    assert mqstore_json("stats", root, "-c", config)["consumers"] == []  # nothing recorded


@pytest.mark.slow
def test_from_a_time(store, config):
    root, put = store
    later = produce(root, config, "after")
    (stamp,) = {m["store_timestamp"] for m in consume(root, config, "probe", "--from", "first")
                if m["body"] == "after"}
    got = consume(root, config, "timed", "--from", stamp)
    assert positions(got) == list(later)  # the first 10 were stored before it
    iso = dt.datetime.fromtimestamp(stamp / 1000).isoformat(timespec="milliseconds")
    by_iso = consume(root, config, "timed-iso", "--from", iso)  # local time, as people type it
    assert [m["body"] for m in by_iso] == ["after"]


@pytest.mark.slow
def test_lag_in_metrics_and_stats_beside_serve(store, config, tmp_path):
    """consume runs read-only beside a running deployment; its commits show in the
    deployment's /metrics and in stats at once."""
    root, put = store
    yaml = tmp_path / "deploy.yaml"
    yaml.write_text(SMALL_CONFIG + f"store: {{root: {json.dumps(str(root))}}}\n"
                    "server: {metrics_listen: \"127.0.0.1:0\", log_level: info}\n")
    proc, url = start(yaml, tmp_path / "serve.log")
    try:
        done = consume(root, config, "billing", "--from", "first", "-n", 4)
        m = scrape(url)
        lag = {q: m[("mqstore_consumer_lag_messages",
                     (("group", "billing"), ("queue_id", str(q)), ("topic", TOPIC)))]
               for q in sorted({q for q, _ in put})}
        taken = positions(done)
        assert lag == {q: sum(1 for qq, _ in put if qq == q) - sum(1 for qq, _ in taken if qq == q)
                       for q in lag}
        assert sum(lag.values()) == PRODUCED - 4
        for q, behind in lag.items():
            age = m[("mqstore_consumer_oldest_unconsumed_age_seconds",
                     (("group", "billing"), ("queue_id", str(q)), ("topic", TOPIC)))]
            assert (age > 0) == (behind > 0)
        assert group_stats(root, config, "billing")["lag"] == PRODUCED - 4
        guide = (REPO / "docs" / "operations.md").read_text()
        for name in ("mqstore_consumer_lag_messages",
                     "mqstore_consumer_oldest_unconsumed_age_seconds"):
            assert f"`{name}`" in guide
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(STOP_TIMEOUT_S)
    assert code == 0, (tmp_path / "serve.log").read_text()


def _read_lines(stream, out: queue.Queue) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def _take(lines: queue.Queue, n: int, timeout_s: float) -> list[dict]:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.001))
        except queue.Empty:
            raise AssertionError(f"{len(got)} of {n} lines within {timeout_s} s") from None
        assert line is not None, "consume exited"
        got.append(json.loads(line))
    return got


@pytest.mark.parametrize("text, says", [
    ('{"offsetTable": {"orders@g": "zzz"}}', "offsetTable['orders@g'] is 'zzz'"),
    ('{"offsetTable": {"orders@g": {"0": "abc"}}}', "offsetTable['orders@g']['0'] is 'abc'"),
    ('{"0": "abc"}', "no offsetTable"),
    ("[" * 100_000, "nested too deep to parse"),
])
@pytest.mark.slow
def test_an_offset_file_of_the_wrong_shape_fails_consume_and_stats_in_one_line(store, config,
                                                                              text, says):
    root, _put = store
    path = root / "config" / "consumerOffset.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    for args in (("consume", root, "-c", config, "-t", TOPIC, "-g", "g"),
                 ("consume", root, "-c", config, "-t", TOPIC, "-g", "g", "--no-commit"),
                 ("stats", root, "-c", config)):
        proc = mqstore(*args, check=1)
        assert error_line(proc).startswith(f"Error: {path} is not a valid document (")
        assert says in error_line(proc) and "Traceback" not in proc.stderr
    assert path.read_text() == text


@pytest.mark.slow
def test_a_group_whose_offsets_were_lost_is_not_started_over(store, config):
    """Consumed 4 of PRODUCED, then the offset file replaced by an empty table: `consume
    --from last` would skip the other 6; it fails, naming the file, until it is restored."""
    root, _put = store
    assert len(consume(root, config, "g", "--from", "first", "-n", "4")) == 4
    path = root / "config" / "consumerOffset.json"
    saved = path.read_text()
    path.write_text('{"offsetTable": {}}')
    proc = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "g", "--from", "last",
                   check=1)
    assert error_line(proc).startswith(
        f"Error: {path} has no offsets for group 'g' on topic '{TOPIC}' (the file holds none)")
    assert path.read_text() == '{"offsetTable": {}}'
    path.write_text(saved)
    assert len(consume(root, config, "g", "--from", "last")) == PRODUCED - 4
