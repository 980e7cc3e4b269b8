"""The remoting byte layouts: frames with JSON and binary headers, fastjson's dialect, batch
bodies; checked against bytes a RocketMQ 4.9.8 broker sent (docs: the research notes' sniffed
frames)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.format import remoting_frame as rf
from mqstore.format import remoting_json as fj
from mqstore.format.remoting_message import BatchItem, decode_batch, encode_batch


def test_binary_reply_is_the_bytes_a_broker_sends():
    # GET_MAX_OFFSET's binary reply as RocketMQ 4.9.8 sent it: code 0, JAVA, version 409,
    # opaque 1002, flag 1, no remark, ext {"offset": "4"}.
    reply = rf.Command(0, opaque=0x3EA, flag=1, ext={"offset": "4"},
                       serialize_type=rf.ROCKETMQ)
    frame = rf.encode(reply)
    header = bytes.fromhex("0000 00 0199 000003ea 00000001 00000000 0000000d 0006") + b"offset" \
        + bytes.fromhex("00000001") + b"4"
    assert frame == (len(header) + 4).to_bytes(4, "big") + bytes([1]) \
        + len(header).to_bytes(3, "big") + header
    back = rf.decode(frame[4:])
    assert (back.code, back.opaque, back.flag, back.remark, back.ext, back.version,
            back.language, back.serialize_type) == (0, 1002, 1, None, {"offset": "4"}, 409,
                                                    "JAVA", rf.ROCKETMQ)


def test_json_header_is_fastjsons_sorted_form():
    cmd = rf.Command(310, opaque=5, ext={"a": "g"}, remark=None)
    header = rf.encode(cmd)[8:]
    assert header == (b'{"code":310,"extFields":{"a":"g"},"flag":0,"language":"JAVA",'
                      b'"opaque":5,"serializeTypeCurrentRPC":"JSON","version":409}')
    assert json.loads(header)["code"] == 310


def test_cpp_json_header_numbers_and_booleans_read_as_strings():
    # The C++ client sends some fields as JSON numbers, booleans as true/false, remark "".
    header = (b'{"code":10,"language":"CPP","version":63,"opaque":7,"flag":0,"remark":"",'
              b'"extFields":{"queueId":3,"sysFlag":0,"batch":false,"topic":"T"}}')
    payload = len(header).to_bytes(4, "big") + header + b"body"
    cmd = rf.decode(payload)
    assert cmd.ext == {"queueId": "3", "sysFlag": "0", "batch": "false", "topic": "T"}
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.remark, cmd.body) == (
        10, "CPP", 63, 7, "", b"body")


@pytest.mark.parametrize("kind", [rf.JSON, rf.ROCKETMQ])
def test_round_trip_keeps_every_field(kind):
    cmd = rf.Command(11, opaque=-5, flag=2, remark="é remark", ext={"k": "v", "ü": "x y"},
                     body=b"\x00\x01", language="CPP", version=63, serialize_type=kind)
    back = rf.decode(rf.encode(cmd)[4:])
    assert (back.code, back.opaque, back.flag, back.remark, back.ext, back.body, back.language,
            back.version, back.serialize_type) == (11, -5, 2, "é remark", {"k": "v", "ü": "x y"},
                                                   b"\x00\x01", "CPP", 63, kind)
    assert back.is_oneway and not back.is_response


@pytest.mark.parametrize("payload, complaint", [
    (b"\x00\x00", "no header length"),
    (b"\x00\x00\x00\x10{}", "runs past"),
    (b"\x05\x00\x00\x02{}", "serialize type 5"),
    (b"\x00\x00\x00\x05[1,2]", "not an object"),
    (b"\x00\x00\x00\x03{\"x", "does not parse"),
    (b'\x00\x00\x00\x0c{"code":"a"}', "'code'"),
    (b"\x01\x00\x00\x03\x00\x00\x00", "cut short"),
])
def test_malformed_payloads_are_refused_with_the_reason(payload, complaint):
    with pytest.raises(rf.FrameError, match=complaint):
        rf.decode(payload)


def test_frame_length_bounds():
    assert rf.frame_length((100).to_bytes(4, "big")) == 100
    with pytest.raises(rf.FrameError, match="must be 4..1024"):
        rf.frame_length((2000).to_bytes(4, "big"), 1024)
    with pytest.raises(rf.FrameError, match="must be 4"):
        rf.frame_length((3).to_bytes(4, "big"))


def test_fastjson_writes_integer_and_object_keys_as_fastjson_does():
    mq = fj.ObjectKey.of(brokerName="b", queueId=0, topic="T")
    text = fj.dumps({"brokerAddrs": {0: "127.0.0.1:10911"},
                     "offsetTable": {mq: {"maxOffset": 2}}, "list": [1, None, True, "x\"y"]})
    assert text == ('{"brokerAddrs":{0:"127.0.0.1:10911"},"offsetTable":{{"brokerName":"b",'
                    '"queueId":0,"topic":"T"}:{"maxOffset":2}},"list":[1,null,true,"x\\"y"]}')
    back = fj.loads(text)
    assert back["brokerAddrs"] == {0: "127.0.0.1:10911"}
    assert back["offsetTable"] == {mq: {"maxOffset": 2}}
    assert list(back["offsetTable"])[0].as_dict() == {"brokerName": "b", "queueId": 0,
                                                     "topic": "T"}


def test_fastjson_reads_a_cpp_heartbeat_with_its_trailing_newline():
    body = (b'{"clientID":"127.0.0.1@1#x","consumerDataSet":[{"consumeFromWhere":0,'
            b'"consumeType":1,"groupName":"g","messageModel":1,"subscriptionDataSet":'
            b'[{"subString":"*","subVersion":"17","topic":"T"}],"unitMode":false}]}\n')
    assert fj.loads(body) == json.loads(body)


@pytest.mark.parametrize("text, complaint", [
    ('{"a":1,}', "expected a value"), ("[1 2]", "expected ',' or ']'"),
    ('{"a" 1}', "expected ':'"), ("{true:1}", "not a string, integer or object"),
    ("1 2", "text after the value"), ('"abc', "Unterminated string"),
    ("[" * 100 + "]" * 100, "nesting deeper"), (b"\xff", "not UTF-8"),
])
def test_fastjson_refuses_what_is_not_its_dialect(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        fj.loads(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), 1 << 63)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_fastjson_reads_standard_json_as_json_does(value):
    text = json.dumps(value)
    assert fj.loads(text) == json.loads(text)
    assert fj.loads(fj.dumps(value)) == value


def test_batch_body_round_trip_and_refusals():
    items = [BatchItem(0, b"one", "KEYS\x01k1\x02UNIQ_KEY\x01U1"), BatchItem(7, b"", "")]
    body = encode_batch(items)
    assert body[:20] == (22 + 3 + 19).to_bytes(4, "big") + bytes(8) + (0).to_bytes(4, "big") \
        + (3).to_bytes(4, "big")
    assert decode_batch(body, 10) == items
    with pytest.raises(ValueError, match="more than 1 messages"):
        decode_batch(body, 1)
    with pytest.raises(ValueError, match="cut short"):
        decode_batch(body[:-3] + b"\x00", 10)
    with pytest.raises(ValueError, match="runs past"):
        decode_batch(body[:30], 10)
    bad_total = (999).to_bytes(4, "big") + body[4:]
    with pytest.raises(ValueError, match="total size 999"):
        decode_batch(bad_total, 10)
