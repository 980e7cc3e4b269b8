"""Store directories as Spark's workers see them: resolved from the path option, opened
read-only once per worker process, opened for writing only for the moment of a commit.

Spark reuses its Python workers between tasks, so a read-only store stays open in a small
per-process cache (a read-only store follows whatever a writer elsewhere appends, so a cached
one is never stale). A directory replaced under the same path is opened afresh.
"""

from __future__ import annotations

import glob
import os
from collections import OrderedDict
from contextlib import contextmanager

from mqstore.config import load_config
from mqstore.store import MessageStore
from mqstore.errors import StoreLockedError
from mqstore.spark.options import OptionError

_GLOB_CHARS = "*?["
_CACHE_SIZE = 32
_MAX_LOOKS = 10_000  # a writer outpacing the looks still ends them
_open: "OrderedDict[str, tuple[tuple[int, int], MessageStore]]" = OrderedDict()


class StoreBusyError(RuntimeError):
    """The store is held open for writing by another process."""


def resolve_paths(patterns: tuple[str, ...]) -> list[str]:
    """The store roots the path option names: each entry a directory or a glob, in order."""
    roots: dict[str, None] = {}
    for pattern in patterns:
        if any(c in pattern for c in _GLOB_CHARS):
            found = [os.path.abspath(p) for p in sorted(glob.glob(pattern))
                     if os.path.isdir(os.path.join(p, "commitlog"))]
            if not found:
                raise OptionError(f"path glob {pattern!r} matches no store directory (a "
                                  f"directory holding commitlog/)")
            roots.update(dict.fromkeys(found))
        elif not os.path.isdir(pattern):
            raise OptionError(f"path {pattern!r} is not a store directory (no such directory)")
        else:
            roots[os.path.abspath(pattern)] = None
    return list(roots)


def resolve_quietly(patterns: tuple[str, ...]) -> list[str]:
    """``resolve_paths`` for a running stream: a glob matching nothing yet is no error."""
    roots: dict[str, None] = {}
    for pattern in patterns:
        if any(c in pattern for c in _GLOB_CHARS):
            roots.update(dict.fromkeys(os.path.abspath(p) for p in sorted(glob.glob(pattern))
                                       if os.path.isdir(os.path.join(p, "commitlog"))))
        else:
            roots[os.path.abspath(pattern)] = None
    return list(roots)


def _identity(root: str) -> tuple[int, int]:
    st = os.stat(root)
    return st.st_dev, st.st_ino


def open_read_only(root: str, config: str | None = None) -> MessageStore:
    """This process's read-only view of ``root`` (cached)."""
    ident = _identity(root)
    cached = _open.get(root)
    if cached is not None:
        if cached[0] == ident:
            _open.move_to_end(root)
            return cached[1]
        del _open[root]
        cached[1].close()
    store = MessageStore.open(root, load_config(config) if config else None, read_only=True)
    _open[root] = (ident, store)
    while len(_open) > _CACHE_SIZE:
        _old_root, (_ident, old) = _open.popitem(last=False)
        old.close()
    return store


def queue_end(store, topic: str, queue_id: int, at_least: int | None = None) -> int:
    """The queue's max offset once this process's view has caught up with the files.

    A read-only store checks a writer's new records before it trusts them, a bounded number
    per look, so a view far behind (another process planned past it, or it was cached while
    the writer went on) moves up over several looks: look until the end reaches ``at_least``
    or stops moving."""
    end = store.max_offset(topic, queue_id)
    for _look in range(_MAX_LOOKS):
        if at_least is not None and end >= at_least:
            break
        again = store.max_offset(topic, queue_id)
        if again == end:
            break
        end = again
    return end


@contextmanager
def open_for_append(root: str, config: str | None = None):
    """``root`` opened for writing, its writer lock held until the block ends. The loops run on
    threads: the store is open only for one commit, inside a Spark worker."""
    cfg = load_config(config, overrides={"dispatch": {"worker": "thread"},
                                         "flush": {"worker": "thread"}})
    try:
        store = MessageStore.open(root, cfg)
    except StoreLockedError as exc:
        raise StoreBusyError(f"cannot append to store {root!r}: {exc}") from None
    try:
        yield store
    finally:
        store.close()


__all__ = ["StoreBusyError", "open_for_append", "open_read_only", "queue_end", "resolve_paths",
           "resolve_quietly"]
