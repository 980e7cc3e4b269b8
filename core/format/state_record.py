"""The state mirror's records: one operation on the store's state files as one message of the
system topic ``rmq_sys_MQSTORE_STATE``, queue 0 (NOTE [ State mirror ] in ``mirror``).

A standard RocketMQ record in every byte: the operation is named by properties, and its bytes
are the body, so RocketMQ's own store builds a consume queue for the topic and otherwise
leaves it alone::

    MQSTATE_OP      write | put | delete | snapshot-begin | snapshot-end
    MQSTATE_PATH    the file, relative to the store root (write, put, delete)
    MQSTATE_POS     write: where the body goes in the file; put: where it goes in the new
                    version (a put larger than one record is cut into chunks)
    MQSTATE_ID      put: the id its chunks share; snapshot-*: the snapshot's id
    MQSTATE_TOTAL   put: the size of the new version (its last chunk ends there)
    MQSTATE_EPOCH   snapshot-end: the master's epoch, when it has one

    body            write, put: the bytes; snapshot-end: every path the snapshot holds, one
                    per line (UTF-8); otherwise empty

Decoding checks every field (``StateRecordError`` naming the first wrong one): a record that
breaks a rule is reported and passed over by its reader, never applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.format.names import SYSTEM_TOPIC_PREFIX

STATE_TOPIC = SYSTEM_TOPIC_PREFIX + "MQSTORE_STATE"
STATE_QUEUE = 0

WRITE, PUT, DELETE = "write", "put", "delete"
SNAPSHOT_BEGIN, SNAPSHOT_END = "snapshot-begin", "snapshot-end"
KINDS = (WRITE, PUT, DELETE, SNAPSHOT_BEGIN, SNAPSHOT_END)

P_OP, P_PATH, P_POS = "MQSTATE_OP", "MQSTATE_PATH", "MQSTATE_POS"
P_ID, P_TOTAL, P_EPOCH = "MQSTATE_ID", "MQSTATE_TOTAL", "MQSTATE_EPOCH"
_MAX_INT = (1 << 63) - 1
_MAX_PATH = 1024


class StateRecordError(ValueError):
    """A record of the state topic that is not an operation (names the field and the rule)."""


@dataclass(frozen=True)
class StateOp:
    kind: str
    path: str = ""
    pos: int = 0
    op_id: int = 0
    total: int = 0
    epoch: int | None = None
    body: bytes = b""

    @property
    def last_chunk(self) -> bool:
        """A put's chunk that completes the new version."""
        return self.pos + len(self.body) == self.total

    def paths(self) -> list[str]:
        """A snapshot-end's list of paths."""
        text = self.body.decode("utf-8")
        return [p for p in text.split("\n") if p]


def properties_of(op: StateOp) -> dict[str, str]:
    """The message properties of ``op`` (its body is ``op.body``)."""
    props = {P_OP: op.kind}
    if op.kind in (WRITE, PUT, DELETE):
        props[P_PATH] = op.path
    if op.kind in (WRITE, PUT):
        props[P_POS] = str(op.pos)
    if op.kind in (PUT, SNAPSHOT_BEGIN, SNAPSHOT_END):
        props[P_ID] = str(op.op_id)
    if op.kind == PUT:
        props[P_TOTAL] = str(op.total)
    if op.kind == SNAPSHOT_END and op.epoch is not None:
        props[P_EPOCH] = str(op.epoch)
    return props


def snapshot_end_body(paths: list[str]) -> bytes:
    return "".join(p + "\n" for p in paths).encode("utf-8")


def decode_op(props: dict[str, str], body: bytes) -> StateOp:
    """The operation a record of the state topic carries (``props``: its decoded properties);
    ``StateRecordError`` when it is none."""
    kind = props.get(P_OP)
    if kind not in KINDS:
        raise StateRecordError(f"{P_OP} {kind!r:.40} is not one of {', '.join(KINDS)}")
    fields: dict = {"kind": kind}
    if kind in (WRITE, PUT, DELETE):
        fields["path"] = check_path(props.get(P_PATH))
    if kind in (WRITE, PUT):
        fields["pos"] = _int(props, P_POS)
        fields["body"] = body
    if kind in (PUT, SNAPSHOT_BEGIN, SNAPSHOT_END):
        fields["op_id"] = _int(props, P_ID)
    if kind == PUT:
        fields["total"] = _int(props, P_TOTAL)
        if fields["pos"] + len(body) > fields["total"]:
            raise StateRecordError(f"put chunk [{fields['pos']}, {fields['pos'] + len(body)}) "
                                   f"runs past the file's size {fields['total']}")
    if kind == SNAPSHOT_END:
        if P_EPOCH in props:
            fields["epoch"] = _int(props, P_EPOCH)
        try:
            paths = body.decode("utf-8").split("\n")
        except UnicodeDecodeError as exc:
            raise StateRecordError(f"snapshot-end's path list is not UTF-8 ({exc.reason} at "
                                   f"byte {exc.start})") from None
        for p in paths:
            if p:
                check_path(p)
        fields["body"] = body
    return StateOp(**fields)


def check_path(path: object) -> str:
    """A path relative to the store root that stays inside it: components of RocketMQ's and
    mqstore's name characters, never ``.`` or ``..``, never absolute."""
    if not isinstance(path, str) or not path or len(path) > _MAX_PATH:
        raise StateRecordError(f"{P_PATH} {path!r:.80} must be a relative path of 1 to "
                               f"{_MAX_PATH} characters")
    for part in path.split("/"):
        if part in ("", ".", "..") or not _safe(part):
            raise StateRecordError(f"{P_PATH} {path!r:.80} has the component {part!r:.40}: "
                                   f"each must be letters, digits and %|_.@- (not . or ..)")
    return path


def _safe(part: str) -> bool:
    return part.isascii() and all(c.isalnum() or c in "%|_.@-" for c in part)


def _int(props: dict[str, str], name: str) -> int:
    text = props.get(name)
    if text is None or not text.isascii() or not text.isdigit() or int(text) > _MAX_INT:
        raise StateRecordError(f"{name} {text!r:.40} must be an integer in [0, 2**63-1]")
    return int(text)
