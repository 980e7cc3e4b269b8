"""Every hook mqstore calls, in the order a store's life runs through them.

Registration hooks hand a registry to plugins; the store then looks strategies up by the names in
its config, so the hot paths call plain objects, not pluggy. Lifecycle hooks (``before_*`` /
``after_*``) run once per batch, never per message. Each docstring says which process runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import pluggy

if TYPE_CHECKING:
    from mqstore.dispatch import DispatchBatch
    from mqstore.message import BatchPutResult, Message
    from mqstore.registry import Registry

PROJECT = "mqstore"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# ----------------------------------------------------------------------------------------
# Registration hooks: called once, in every process that builds a plugin manager
# ----------------------------------------------------------------------------------------


@hookspec
def register_writers(registry: "Registry") -> None:
    """Register commit-log writers: ``registry.add("mmap", factory)``.

    ``factory(commit_log, config)`` returns an object with ``write(segment, data) -> int``
    and optionally ``before_roll()``, ``write_blank(segment, data)``, ``pool`` and ``close()``
    (see docs/plugin_hooks.md). The YAML key ``writer.kind`` picks one by name. Runs in: the
    store process.
    """


@hookspec
def register_queue_selectors(registry: "Registry") -> None:
    """Register queue selectors: ``registry.add("round_robin", factory)``.

    ``factory(config, string_hash)`` returns an object with ``select(message, queue_count) -> int``.
    The YAML key ``queue_select.selector`` picks one. Runs in: the store process.
    """


@hookspec
def register_filters(registry: "Registry") -> None:
    """Register subscription filter types by expression type: ``registry.add("TAG", factory)``.

    ``factory(expression, string_hash)`` returns a compiled filter (see ``mqstore.filtering``).
    ``store.get(..., expression_type=NAME)`` uses it. Runs in: every process that serves pulls.
    """


@hookspec
def register_dispatchers(registry: "Registry") -> None:
    """Register dispatchers (consume-queue builder, index builders): ``registry.add(name, factory)``.

    ``factory(store)`` returns an object with ``dispatch(batch)`` and ``close()``. Every
    registered dispatcher runs, in registration order. Runs in: the dispatch loop's process.
    """


@hookspec
def register_flush_policies(registry: "Registry") -> None:
    """Register flush policies: ``registry.add("async", factory)``.

    ``factory(store)`` returns an object with ``start()``, ``after_append(end_offset, wait)``
    -> PutStatus and ``stop()``; optionally ``visible_after_flush`` and a static
    ``schedule(config)`` for the flush loop's passes. The YAML key ``flush.mode`` picks one.
    Runs in: the store process (and the flush worker, which reads ``schedule``).
    """


# ----------------------------------------------------------------------------------------
# Append hooks: the store process, on the calling thread, once per put / put_batch
# ----------------------------------------------------------------------------------------


@hookspec
def before_append(messages: "Sequence[Message]") -> None:
    """Called before the messages are validated and written; raise to reject the whole call.

    Runs in: the store process, the caller's thread, outside the put lock.
    """


@hookspec
def after_append(result: "BatchPutResult") -> None:
    """Called after a put or put_batch wrote its records (also for a rejected call).

    Runs in: the store process, the caller's thread, outside the put lock.
    """


# ----------------------------------------------------------------------------------------
# Dispatch hooks: the dispatch loop, once per batch of records
# ----------------------------------------------------------------------------------------


@hookspec
def after_dispatch(batch: "DispatchBatch") -> None:
    """Called after every dispatcher has processed ``batch``.

    Runs in: the dispatch loop (a worker thread of the store process).
    """


# ----------------------------------------------------------------------------------------
# Flush hooks: the flush loop
# ----------------------------------------------------------------------------------------


@hookspec
def after_flush(flushed_offset: int) -> None:
    """Called after the commit log was forced to disk up to ``flushed_offset``.

    Runs in: the flush loop (the flush worker process, or its thread with flush.worker: thread).
    """


# ----------------------------------------------------------------------------------------
# Cleanup hooks: after old commit-log segments were deleted
# ----------------------------------------------------------------------------------------


@hookspec
def after_cleanup(min_phys_offset: int) -> None:
    """Called after cleanup deleted commit-log segments; ``min_phys_offset`` is the new first
    stored byte. Consume queues and dispatchers with ``after_cleanup`` have already dropped
    their files below it.

    Runs in: the thread that ran the cleanup (the store process).
    """


__all__ = [
    "hookspec", "hookimpl", "register_writers", "register_queue_selectors", "register_filters",
    "register_dispatchers", "register_flush_policies", "before_append", "after_append",
    "after_dispatch", "after_flush", "after_cleanup",
]
