"""Consumers on a store: group consumers with committed offsets, and the pop consumer.

``MessageStore.consumer(...)`` opens a ``GroupConsumer`` (``MessageStore.peek(...)`` a
``GroupPeek``, reading as the group would without joining it); ``MessageStore.pop/ack/
change_invisible_duration`` are the pop consumer (RocketMQ 5's SimpleConsumer). Both read
through the store's columnar read path and wait on the dispatch notification; see
docs/consumers.md.
"""

from mqstore.consumer.errors import ReceiptHandleError, StaleReceiptHandleError
from mqstore.consumer.group import GroupConsumer
from mqstore.consumer.locked_json import CorruptStateError
from mqstore.consumer.messages import ConsumedMessage, Polled
from mqstore.consumer.peek import GroupPeek
from mqstore.consumer.pop import PoppedMessage
from mqstore.consumer.progress import QueueLag

__all__ = ["GroupConsumer", "GroupPeek", "ConsumedMessage", "Polled", "PoppedMessage", "QueueLag",
           "ReceiptHandleError", "StaleReceiptHandleError", "CorruptStateError"]
