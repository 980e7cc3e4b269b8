"""Which store a directory holds, wherever it is: the id its shared memory is named after.

A store's shared memory (its shared positions and its transient pool) outlives a killed store
process, and the next writable open must find it: the pool may hold acknowledged records the
files lack. The name therefore comes from something that moves with the files, not from where
they are: ``store_id`` in ``mqstore.json``, made at the first writable open. Beside it,
``directory`` records where that open found the store::

    "store_id": "<32 hex digits>",
    "directory": {"path": "<real path>", "device": <st_dev>, "inode": <st_ino>}

A directory renamed (or moved to another file system) keeps its id, so its pool is found
again. A copy carries the same id, and two copies must never share shared memory: a copy's
open would write back and remove a pool that belongs to the original, or attach its own to
it. So at a writable open, a directory that is not the one recorded, while the recorded one is
still there under its path with the same id, is a copy: it takes a new id and leaves the
original's shared memory alone. (A copy opened after its original was removed or moved away
inherits the id, and with it whatever the pool held: the same history up to the copy.)
"""

from __future__ import annotations

import os
import re
import secrets

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from mqstore.errors import StoreCorruptError
from mqstore.storage.meta_file import read_meta

ID_KEY = "store_id"
HOME_KEY = "directory"
_ID = re.compile(r"[0-9a-f]{32}")


class Home(BaseModel):
    """Where a writable open last found the store."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    path: StrictStr
    device: StrictInt
    inode: StrictInt


def new_store_id() -> str:
    return secrets.token_hex(16)


def recorded_id(meta: dict) -> str | None:
    """The id ``mqstore.json`` records, or None (none yet, or not one of ours)."""
    value = meta.get(ID_KEY)
    return value if isinstance(value, str) and _ID.fullmatch(value) else None


def home_of(root: str) -> Home:
    st = os.stat(root)
    return Home(path=os.path.realpath(root), device=st.st_dev, inode=st.st_ino)


def claim(root: str, meta: dict) -> tuple[str | None, str | None]:
    """For a writable open of ``root``: the recorded id when the store is still this
    directory's (recorded here, or moved here), else None (a new id must be taken); and a
    note for the open's report when something moved or was copied."""
    store_id = recorded_id(meta)
    if store_id is None:
        return None, None
    try:
        recorded = Home.model_validate(meta.get(HOME_KEY))
    except ValidationError:
        return store_id, None  # no home recorded yet: the directory is where the id lives
    here = home_of(root)
    if (recorded.device, recorded.inode) == (here.device, here.inode):
        return store_id, None
    if _original_still_there(recorded, store_id):
        return None, (f"{root} is a copy of the store at {recorded.path} (both record store "
                      f"id {store_id}): it takes an id of its own, and the shared memory of "
                      f"the original stays the original's")
    return store_id, f"the store moved from {recorded.path} to {here.path}"


def _original_still_there(recorded: Home, store_id: str) -> bool:
    try:
        st = os.stat(recorded.path)
    except OSError:
        return False
    if (st.st_dev, st.st_ino) != (recorded.device, recorded.inode):
        return False
    try:
        meta = read_meta(recorded.path) or {}
    except StoreCorruptError:
        return False
    return recorded_id(meta) == store_id


def settled(root: str, store_id: str | None) -> dict:
    """The id and home a writable open records (a new id when ``store_id`` is None)."""
    return {ID_KEY: store_id or new_store_id(), HOME_KEY: home_of(root).model_dump()}
