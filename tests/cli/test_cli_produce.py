"""``mqstore produce``: keys and tags per line, a UNIQ_KEY per message as RocketMQ's producers
set one, and how many messages were stored, said whatever stops it. Real subprocesses; the
UNIQ_KEY maker also in process, on a clock the test moves."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from cli_support import error_line, mqstore, mqstore_json
from mqstore.cli.uniq_keys import COUNTER_SPAN, UniqKeys, month_start_ms

pytestmark = pytest.mark.usefixtures("no_plugin_env")


def stored(root, config, topic: str) -> list[dict]:
    """Every message of ``topic``, in queue order (consumed by a fresh group)."""
    proc = mqstore("consume", root, "-c", config, "-t", topic, "-g", f"check-{time.time_ns()}",
                   "--from", "first", "--format", "json")
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_parse_key_takes_each_lines_keys(tmp_path, config):
    root = tmp_path / "store"
    lines = "order-1:{\"id\": 1}\norder-2 vip:{\"id\": 2}\n:no keys: a colon in the body\n"
    out = mqstore("produce", root, "-c", config, "-t", "orders", "-q", "0", "--tags", "new",
                  "--parse-key", ":", "--summary", input=lines).stdout
    (topic,) = mqstore_json("stats", root, "-c", config)["topics"]
    assert out.splitlines()[-1] == (f"stored 3 message(s), {topic['bytes']} bytes, in orders "
                                    f"queue(s) 0")
    got = [(m["body"], m["keys"], m["tags"]) for m in stored(root, config, "orders")]
    assert got == [('{"id": 1}', ["order-1"], "new"), ('{"id": 2}', ["order-2", "vip"], "new"),
                   ("no keys: a colon in the body", [], "new")]
    (found,) = mqstore_json("query", root, "key", "orders", "vip", "-c", config)["messages"]
    assert found["body"] == '{"id": 2}'


def test_json_lines_carry_body_tags_keys_and_properties(tmp_path, config):
    root = tmp_path / "store"
    lines = [{"body": "paid #1", "tags": "paid", "keys": ["order-1"],
              "properties": {"region": "eu"}},
             {"body_base64": "AAEC/w==", "keys": "k1 k2"},  # bytes, and KEYS as a string
             {"body": "plain"}]
    out = mqstore_json("produce", root, "-c", config, "-t", "orders", "-q", "0", "--json-lines",
                       "--tags", "default", "-p", "source=cli",
                       input="".join(json.dumps(line) + "\n" for line in lines))
    assert out["count"] == 3
    got = [(m["body_base64"], m["tags"], m["keys"],
            {k: v for k, v in m["properties"].items() if k not in ("TAGS", "KEYS", "UNIQ_KEY")})
           for m in stored(root, config, "orders")]
    assert got == [("cGFpZCAjMQ==", "paid", ["order-1"], {"source": "cli", "region": "eu"}),
                   ("AAEC/w==", "default", ["k1", "k2"], {"source": "cli"}),
                   ("cGxhaW4=", "default", [], {"source": "cli"})]


def test_every_message_gets_a_uniq_key_that_sorts_by_time(tmp_path, config):
    root = tmp_path / "store"
    before = time.time_ns() // 1_000_000
    out = mqstore_json("produce", root, "-c", config, "-t", "logs", "--lines", "-",
                       input="".join(f"m{i}\n" for i in range(2500)))  # three batches
    after = time.time_ns() // 1_000_000
    uniq = [m["uniq_key"] for m in out["messages"]]
    assert len(set(uniq)) == 2500 and uniq == sorted(uniq)
    assert all(len(u) == 32 and u == u.upper() and int(u, 16) >= 0 for u in uniq)
    assert len({u[:20] for u in uniq}) == 1  # the producer's address, pid and number
    counters = [int(u[28:], 16) for u in uniq]
    assert counters == [(counters[0] + i) % COUNTER_SPAN for i in range(2500)]
    month, _next = month_start_ms(before)
    made = [month + int(u[20:28], 16) for u in uniq]  # ms since the month's start, local time
    assert before <= made[0] <= made[-1] <= after
    # stored as the UNIQ_KEY property, and found by it
    (found,) = mqstore_json("query", root, "unique-key", "logs", uniq[1234], "-c",
                            config)["messages"]
    assert (found["body"], found["uniq_key"]) == ("m1234", uniq[1234])
    # a UNIQ_KEY given is kept
    given = mqstore_json("produce", root, "-c", config, "-t", "logs", "-p", "UNIQ_KEY=mine", "x")
    assert given["messages"][0]["uniq_key"] == "mine"


def test_a_bad_line_stops_produce_saying_how_many_were_stored(tmp_path, config):
    root = tmp_path / "store"
    lines = "".join(f"k{i}:v{i}\n" for i in range(1, 1500))
    bad = mqstore("produce", root, "-c", config, "-t", "logs", "--parse-key", ":",
                  input=lines + "no separator here\n" + "k1501:v1501\n", check=2)
    assert error_line(bad) == ("Error: line 1500 has no key separator ':' (--parse-key: each "
                               "line is KEYS:BODY); the 1499 message(s) before it were stored")
    assert mqstore_json("stats", root, "-c", config)["topics"][0]["messages"] == 1499
    # a line the store refuses: the batch holding it wrote nothing, so what came before it in
    # that batch is put again, and nothing after it
    refused = mqstore("produce", root, "-c", config, "-t", "more", "--parse-key", ":",
                      input="".join(f"k{i}:v{i}\n" for i in range(1, 1200))
                      + "k\x01:x\nk1201:v\n", check=2)
    assert error_line(refused) == (r"Error: line 1200: key 'k\x01' contains a reserved "
                                   r"separator (\x01 or \x02); the 1199 message(s) before it "
                                   r"were stored")
    topics = {t["topic"]: t["messages"] for t in mqstore_json("stats", root, "-c",
                                                                config)["topics"]}
    assert topics == {"logs": 1499, "more": 1199}
    not_json = mqstore("produce", root, "-c", config, "-t", "j", "--json-lines",
                       input='{"body": "a"}\n{"body": "b", "tag": "x"}\n', check=2)
    assert error_line(not_json) == ("Error: line 2 is not a message as --json-lines takes "
                                    "one: tag: Extra inputs are not permitted; the 1 "
                                    "message(s) before it were stored")
    first = mqstore("produce", root, "-c", config, "-t", "j", "--json-lines",
                    input='{"tags": "x"}\n', check=2)
    assert error_line(first) == ("Error: line 1 is not a message as --json-lines takes one: "
                                 "Value error, give exactly one of body and body_base64; "
                                 "nothing was stored")
    both = mqstore("produce", root, "-c", config, "-t", "j", "--json-lines", "--parse-key", ":",
                   "x", check=2)
    assert "--parse-key and --json-lines are two ways of reading a line" in both.stderr


def test_uniq_keys_never_go_back_when_the_counter_wraps_in_one_millisecond():
    start = 1_700_000_000_000
    looks = []

    def clock() -> int:  # stands still for three looks, then moves on a ms
        looks.append(start if len(looks) < 3 else start + 1)
        return looks[-1]

    keys = UniqKeys(address=bytes([10, 0, 0, 1]), pid=0x12345, salt=7, now_ms=clock,
                    counter=COUNTER_SPAN - 2)
    assert keys.prefix == "0A000001" + "2345" + "00000007"
    month, _ = month_start_ms(start)
    first = keys.take(2)  # counters FFFE and FFFF, in the same ms
    assert [k[20:] for k in first] == [f"{start - month:08X}FFFE", f"{start - month:08X}FFFF"]
    (wrapped,) = keys.take(1)  # counter 0000 in that ms would sort first: it waits a ms
    assert wrapped[20:] == f"{start + 1 - month:08X}0000" and wrapped > first[-1]
    assert looks == [start, start, start, start + 1]
    # a clock stepping back never makes an id sort before the one made before it
    looks.clear()
    keys._now_ms = lambda: start - 5000
    (back,) = keys.take(1)
    assert back[20:] == f"{start + 1 - month:08X}0001" and back > wrapped


def test_month_start_is_local_midnight_of_the_first():
    start, following = month_start_ms(int(dt.datetime(2024, 2, 17, 15, 30).timestamp() * 1000))
    assert dt.datetime.fromtimestamp(start / 1000) == dt.datetime(2024, 2, 1)
    assert dt.datetime.fromtimestamp(following / 1000) == dt.datetime(2024, 3, 1)
