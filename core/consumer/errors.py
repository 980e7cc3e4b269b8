"""Errors of the pop consumer's receipt handles."""

from __future__ import annotations

from mqstore.errors import MQStoreError


class ReceiptHandleError(MQStoreError, ValueError):
    """A receipt handle this store never handed out (malformed, or of no popped message);
    RocketMQ's INVALID_RECEIPT_HANDLE."""


class StaleReceiptHandleError(ReceiptHandleError):
    """A receipt handle of a delivery that is over: the message was acknowledged, delivered
    again, or given a new invisible time (which hands out a new handle)."""
