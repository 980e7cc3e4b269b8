"""The store's pop API as the endpoint uses it: the one module that calls ``store.pop``,
``store.ack``, ``store.change_invisible_duration`` and ``store.dead_letter`` and knows what a receipt handle holds.

Receive is pop across all the topic's queues; a group new to a queue starts there as RocketMQ
5's proxy starts it (``consume_from="max"``: ConsumeInitMode.MAX). A handle is checked against
the topic and group of the request that presents it, so one group cannot acknowledge another's
deliveries. ``ack`` takes every handle of a request at once and answers each.

A filter is checked before the pop, compiled on a thread of its own (one: compiles queue up
there, not on the event loop, where a long SQL92 expression would stall every other call) and
cached by the store for the pop that follows. Its text is bounded first (``MAX_FILTER_CHARS``,
whatever its type; the SQL92 plugin bounds its nesting too).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from mqstore.consumer import names
from mqstore.consumer.errors import ReceiptHandleError
from mqstore.consumer.pop import parse_handle
from mqstore.endpoint.protocol import Code, definition_pb2
from mqstore.endpoint.status import EndpointError
from mqstore.format.names import shown

MAX_FILTER_CHARS = 16_384  # a filter expression's text, any type
FILTER_TYPES = {definition_pb2.FilterType.FILTER_TYPE_UNSPECIFIED: "TAG",
                definition_pb2.FilterType.TAG: "TAG",
                definition_pb2.FilterType.SQL: "SQL92"}


def filter_of(expression) -> tuple[str | None, str]:
    """``(expression, expression_type)`` for the store of a request's FilterExpression."""
    kind = FILTER_TYPES.get(expression.type)
    if kind is None:
        raise EndpointError(Code.ILLEGAL_FILTER_EXPRESSION,
                            f"filter type {expression.type} is not TAG or SQL")
    text = expression.expression
    if len(text) > MAX_FILTER_CHARS:
        raise EndpointError(Code.ILLEGAL_FILTER_EXPRESSION, (
            f"{kind} filter {shown(text)} is longer than {MAX_FILTER_CHARS} characters, the "
            f"longest this endpoint compiles"))
    text = text.strip()
    if kind == "TAG" and text in ("", "*"):
        return None, kind
    return text, kind


class Pops:
    def __init__(self, store) -> None:
        self._store = store
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="mqstore-grpc-filter")

    async def check_filter(self, expression: str | None, expression_type: str) -> None:
        """ILLEGAL_FILTER_EXPRESSION unless it compiles; compiled off the event loop."""
        if expression is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._compiler, self._store.view.compile_filter, expression, expression_type)
        except ValueError as exc:
            raise EndpointError(Code.ILLEGAL_FILTER_EXPRESSION,
                                f"{expression_type} filter {shown(expression)}: {exc}") from None

    def close(self) -> None:
        self._compiler.shutdown(wait=True)

    def pop(self, group: str, topic: str, max_msgs: int, invisible_ms: int,
            expression: str | None, expression_type: str, max_bytes: int) -> list:
        """Popped messages (each with ``receipt_handle`` and ``delivery_attempt``), at most
        ``max_bytes`` of records but one at least, without waiting: the endpoint's own long
        poll waits between pops."""
        return self._store.pop(group, topic, max_msgs, invisible_ms, expression=expression,
                               expression_type=expression_type, consume_from=names.MAX,
                               max_bytes=max(1, max_bytes))

    def ack(self, group: str, topic: str, handles: list[str]) -> list[str | None]:
        """Acknowledge the handles in one batch (``store.ack([...])``); per handle None, or why
        it was refused."""
        out: list[str | None] = [None] * len(handles)
        mine = []
        for i, handle in enumerate(handles):
            try:
                self._check_owner(handle, group, topic)
                mine.append(i)
            except ReceiptHandleError as exc:
                out[i] = str(exc)
        if mine:
            for i, problem in zip(mine, self._store.ack([handles[i] for i in mine])):
                out[i] = None if problem is None else str(problem)
        return out

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """The new handle of a delivery given ``invisible_ms`` more."""
        try:
            self._check_owner(handle, group, topic)
            return self._store.change_invisible_duration(handle, invisible_ms)
        except ReceiptHandleError as exc:
            raise EndpointError(Code.INVALID_RECEIPT_HANDLE, str(exc)) from None

    def dead_letter(self, group: str, topic: str, handle: str) -> None:
        """Send the delivery's message to the group's dead-letter queue now (it ends)."""
        try:
            self._check_owner(handle, group, topic)
            self._store.dead_letter(handle)
        except ReceiptHandleError as exc:
            raise EndpointError(Code.INVALID_RECEIPT_HANDLE, str(exc)) from None

    def max_attempts(self, group: str) -> int:
        """The deliveries a message gets in ``group``: its retryMaxTimes + 1."""
        return self._store.group_config(group).max_attempts

    def fifo(self, group: str) -> bool:
        """Whether ``group`` is a FIFO group (its consumeMessageOrderly)."""
        return self._store.group_config(group).orderly

    @staticmethod
    def _check_owner(handle: str, group: str, topic: str) -> None:
        owner_topic, owner_group = parse_handle(handle)[:2]
        if (owner_topic, owner_group) != (topic, group):
            raise ReceiptHandleError(f"receipt handle {handle!r} is a delivery to group "
                                     f"{owner_group!r} of topic {owner_topic!r}, not to group "
                                     f"{group!r} of topic {topic!r}")


__all__ = ["Pops", "filter_of", "FILTER_TYPES"]
