"""The Apache proxy's rules for what a client sends in a message, beyond what the store itself
refuses (``format.properties``): its GrpcValidator and SendMessageActivity.

    tag              not blank (only whitespace), no ``|`` (it separates tags in a filter:
                     a tag ``a|b`` could never be selected), no control character
                                                                    ILLEGAL_MESSAGE_TAG (40004)
    each key         not blank, no control character                ILLEGAL_MESSAGE_KEY (40005)
    message group    not blank, under MAX_MESSAGE_GROUP_BYTES of UTF-8, no control character
                                                                    ILLEGAL_MESSAGE_GROUP (40006)
    user property    a name and a value without control characters
                                                           ILLEGAL_MESSAGE_PROPERTY_KEY (40007)

A control character is Java's ``Character.isISOControl``: U+0000..U+001F and U+007F..U+009F.
An empty tag, key list or group means none, as the proxy takes it.
"""

from __future__ import annotations

import re

from mqstore.endpoint.protocol import Code
from mqstore.endpoint.status import EndpointError
from mqstore.format.names import shown

MAX_MESSAGE_GROUP_BYTES = 64  # the proxy's maxMessageGroupSize: a group of 64 bytes is refused
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _refuse(code: int, what: str, value: str, why: str) -> EndpointError:
    return EndpointError(code, f"{what} {shown(value)} {why}")


def _plain(code: int, what: str, value: str) -> None:
    if not value.strip():
        raise _refuse(code, what, value, "is blank (only whitespace)")
    if _CONTROL.search(value):
        raise _refuse(code, what, value, "contains a control character")


def check_tag(tag: str) -> None:
    if not tag:
        return
    if "|" in tag:
        raise _refuse(Code.ILLEGAL_MESSAGE_TAG, "tag", tag,
                      "contains '|', which separates the tags of a filter")
    _plain(Code.ILLEGAL_MESSAGE_TAG, "tag", tag)


def check_keys(keys) -> None:
    for key in keys:
        if key:
            _plain(Code.ILLEGAL_MESSAGE_KEY, "key", key)


def check_message_group(group: str) -> None:
    if not group:
        return
    _plain(Code.ILLEGAL_MESSAGE_GROUP, "message group", group)
    size = len(group.encode("utf-8", "surrogatepass"))
    if size >= MAX_MESSAGE_GROUP_BYTES:
        raise _refuse(Code.ILLEGAL_MESSAGE_GROUP, "message group", group,
                      f"is {size} bytes of UTF-8; it must be under {MAX_MESSAGE_GROUP_BYTES}")


def check_user_property(name: str, value: str) -> None:
    if _CONTROL.search(name):
        raise _refuse(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "property name", name,
                      "contains a control character")
    if _CONTROL.search(value):
        raise _refuse(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"the value of property {shown(name)}",
                      value, "contains a control character")


__all__ = ["check_tag", "check_keys", "check_message_group", "check_user_property",
           "MAX_MESSAGE_GROUP_BYTES"]
