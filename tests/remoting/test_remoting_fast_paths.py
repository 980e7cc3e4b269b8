"""The send path's fast paths give the bytes and fields the general paths give: the PUT_OK
answer's header from its template, the JSON request header's decoding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.format import remoting_frame as rf
from mqstore.format.hosts import parse_host
from mqstore.format.properties import EncodedProperties, decode_properties
from mqstore.format.record import offset_msg_id
from mqstore.message import PutStatus
from mqstore.remoting import send

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
HOSTS = st.sampled_from(["127.0.0.1:10911", "10.1.2.3:1", "[::1]:10911",
                         "[fe80::1:2:3]:65535"])


class _Broker:
    def __init__(self, host: str) -> None:
        self.address, self.host = host, parse_host(host)


def _general(cmd: rf.Command) -> bytes:
    cmd.encoded_header = None
    return b"".join(rf.encode_parts(cmd))


@settings(max_examples=300, deadline=None)
@given(opaque=INT32, queue_id=st.integers(0, (1 << 31) - 1),
       queue_offset=st.integers(0, (1 << 63) - 1),
       phys=st.lists(st.integers(0, (1 << 63) - 1), min_size=1, max_size=5), host=HOSTS)
def test_put_ok_answer_header_is_the_general_encoding(opaque, queue_id, queue_offset, phys,
                                                     host):
    request = rf.Command(10, opaque=opaque, language="CPP", version=63)
    result = (PutStatus.PUT_OK, None, queue_id, queue_offset, phys)
    response = send.answer(_Broker(host), request, result)
    assert response.encoded_header is not None
    fast = b"".join(rf.encode_parts(response))
    assert fast == _general(response)
    back = rf.decode(fast[4:])
    assert (back.code, back.opaque, back.flag, back.remark) == (0, opaque, 1, None)
    assert back.ext["queueId"] == str(queue_id)
    assert back.ext["queueOffset"] == str(queue_offset)
    assert back.ext["msgId"] == ",".join(offset_msg_id(parse_host(host), p) for p in phys)


def test_other_answers_take_the_general_encoder():
    broker = _Broker("127.0.0.1:10911")
    binary = rf.Command(310, opaque=3, serialize_type=rf.ROCKETMQ)
    ok = send.answer(broker, binary, (PutStatus.PUT_OK, None, 1, 2, [3]))
    assert ok.encoded_header is None and rf.decode(rf.encode(ok)[4:]).ext["queueId"] == "1"
    json_req = rf.Command(310, opaque=4)
    late = send.answer(broker, json_req, (PutStatus.FLUSH_DISK_TIMEOUT, "disk slow", 1, 2, [3]))
    assert late.encoded_header is None and late.remark == "disk slow"


def test_a_template_refuses_a_shape_it_cannot_cut():
    with pytest.raises(ValueError, match="cannot template"):
        rf.JsonTemplate(0, {"a": "@@hole0@@", "b": ""}, ("b",))


def _loads_or_error(parse, header: bytes):
    try:
        return ("value", parse(header))
    except (ValueError, RecursionError) as exc:
        return ("error", type(exc).__name__, str(exc))


CPP_SEND = ('{"code":10,"language":"CPP","version":63,"opaque":7,"flag":0,"remark":"",'
            '"extFields":{"producerGroup":"g","topic":"T","defaultTopic":"TBW102",'
            '"defaultTopicQueueNums":4,"queueId":3,"sysFlag":0,"bornTimestamp":"1700000000000",'
            '"flag":0,"properties":"KEYS\\u0001k\\u0002","reconsumeTimes":"0",'
            '"unitMode":"false","batch":false}}')
JAVA_SEND = ('{"code":310,"extFields":{"a":"g","b":"T","c":"TBW102","d":"4","e":"1","f":"0",'
             '"g":"1700000000000","h":"0","i":"UNIQ_KEY\\u0001AB\\u0002","j":"0","k":"false",'
             '"m":"false","n":"broker-a"},"flag":0,"language":"JAVA","opaque":5,'
             '"serializeTypeCurrentRPC":"JSON","version":409}')


@pytest.mark.parametrize("header", [
    CPP_SEND.encode(), JAVA_SEND.encode(),
    CPP_SEND.replace('"T"', '"T\u00e9\u4e2d\U0001f600"').encode(),  # unicode as it is
    CPP_SEND.replace('"T"', '"T\\u00e9\\ud83d\\ude00\\"q\\\\"').encode(),  # escaped
    CPP_SEND.replace('"queueId":3', '"queueId":"3"').encode(),  # numbers as strings
    CPP_SEND.replace('"reconsumeTimes":"0",', "").encode(),  # an optional field missing
    JAVA_SEND.replace('"opaque":5', '"opaque":5.0').encode(),
    b'{"code":34,"extFields":{0:"broker-a"}}',  # fastjson's integer key: not JSON
    b'{"code":34,"extFields":{{"brokerName":"b"}:1}}',  # fastjson's object key
    b' ' + JAVA_SEND.encode(), JAVA_SEND.encode() + b'\n', JAVA_SEND.encode() + b'{}',
    b'\xef\xbb\xbf' + JAVA_SEND.encode(),  # a UTF-8 byte order mark
    JAVA_SEND.encode("utf-16-le"), JAVA_SEND.encode("utf-16"), JAVA_SEND.encode("utf-32"),
    b'{"code":10,"remark":"\xed\xa0\x80"}',  # a surrogate in UTF-8 bytes
    b'{"code":10,"remark":"\xff"}', b'{"code":10,"remark":"a\x00b"}', b'', b'[1,2]', b'7',
    b'{"code":10,"code":11}', b'{"code":NaN}', b'[' * 100000,
    CPP_SEND.encode() + b'\n', CPP_SEND.encode() + b' \t\r\n ', CPP_SEND.encode() + b'\n\x0b',
    CPP_SEND.encode() + b'\x0c', CPP_SEND.encode() + '\u00a0'.encode(),
    CPP_SEND.encode() + '\u3000'.encode(), CPP_SEND.encode() + b'\n\x00',
    CPP_SEND.encode() + b'\n{}', b'7 \n', b'"s"\r\n',
], ids=lambda header: f"{header[:24]!r}{header[-4:]!r}")
def test_json_header_parse_is_json_loads(header):
    assert _loads_or_error(rf._parse_json, header) == _loads_or_error(json.loads, header)


@pytest.mark.parametrize("tail", [b"", b"\n", b"\r\n", b" \t\n"])
def test_a_header_ending_in_json_whitespace_is_read_once(monkeypatch, tail):
    """The C++ client ends each JSON header with a newline: read on the fast path, not
    parsed a second time by ``json.loads``."""
    def no_second_parse(*args, **kwargs):
        raise AssertionError("json.loads parsed the header again")
    monkeypatch.setattr(rf.json, "loads", no_second_parse)
    header = CPP_SEND.encode() + tail
    cmd = rf.decode(len(header).to_bytes(4, "big") + header)
    assert (cmd.code, cmd.opaque, cmd.language, cmd.ext["queueId"]) == (10, 7, "CPP", "3")


@pytest.mark.parametrize("fields, complaint", [
    ('"code":10,"opaque":2147483648', "'opaque' is 2147483648"),
    ('"code":10,"flag":true', "'flag' is True"),
    ('"code":"10"', "'code' is '10'"),
    ('"opaque":1', "'code' is None"),
    ('"code":10,"version":1.0', "'version' is 1.0"),
    ('"code":-2147483649', "'code' is -2147483649"),
])
def test_json_header_integers_are_checked_on_the_fast_path_too(fields, complaint):
    header = ("{" + fields + "}").encode()
    with pytest.raises(rf.FrameError, match=complaint):
        rf.decode(len(header).to_bytes(4, "big") + header)


@settings(max_examples=300, deadline=None)
@given(ext=st.dictionaries(st.text(max_size=8), st.one_of(
    st.text(max_size=12), st.integers(-(1 << 40), 1 << 40), st.booleans()), max_size=6),
       remark=st.one_of(st.none(), st.text(max_size=12)), opaque=INT32,
       ascii_only=st.booleans(), spaces=st.booleans())
def test_any_json_header_decodes_as_json_loads_reads_it(ext, remark, opaque, ascii_only,
                                                        spaces):
    doc = {"code": 10, "opaque": opaque, "flag": 0, "language": "CPP", "version": 63,
           "extFields": ext}
    if remark is not None:
        doc["remark"] = remark
    header = json.dumps(doc, ensure_ascii=ascii_only,
                        separators=(", ", ": ") if spaces else (",", ":")).encode()
    assert rf._parse_json(header) == json.loads(header)
    cmd = rf.decode(len(header).to_bytes(4, "big") + header + b"b")
    assert cmd.ext == {k: v if isinstance(v, str) else str(v).lower() if isinstance(v, bool)
                       else str(v) for k, v in ext.items()}
    assert (cmd.code, cmd.opaque, cmd.remark, cmd.body) == (10, opaque, remark, b"b")


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(["\x01", "\x02", "KEYS", "k1", "CLUSTER", "\u00e9", "",
                                      "__RMQ.TRANSIENT.x"]), max_size=10).map("".join),
       cluster=st.sampled_from(["DefaultCluster", "c\x02", "\u00e9"]))
def test_a_sends_properties_are_the_decoded_ones_with_its_cluster(text, cluster):
    general = decode_properties(text)
    general.update({send.PROPERTY_CLUSTER: cluster})
    got = send._properties(text, cluster)
    if type(got) is not EncodedProperties:
        got.update({send.PROPERTY_CLUSTER: cluster})  # as messages_of does
    assert got == general and list(got) == list(general)


def test_the_cpp_clients_properties_keep_their_text():
    text = "KEYS\x01k298\x02TAGS\x01bench\x02UNIQ_KEY\x010100007F00\x02WAIT\x01true\x02"
    got = send._properties(text, "DefaultCluster")
    assert type(got) is EncodedProperties
    assert got.text == text + "CLUSTER\x01DefaultCluster\x02"
