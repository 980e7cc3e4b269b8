"""Every hook mqstore calls, in the order a store's life runs through them.

Registration hooks hand a registry to plugins; the store then looks strategies up by the names in
its config, so the hot paths call plain objects, not pluggy. The factories and the objects they
return are typed in ``mqstore.plugin_api.contracts``. Lifecycle hooks (``before_*`` / ``after_*``) run
once per batch, never per message. Each docstring says which process runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import pluggy

if TYPE_CHECKING:
    from mqstore.plugin_api.batch import DispatchBatch
    from mqstore.message import BatchPutResult, Message, MessageBatch
    from mqstore.plugin_api.registry import Registry

PROJECT = "mqstore"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# ----------------------------------------------------------------------------------------
# Registration hooks: called once in every process that builds a plugin manager (the store
# process, each worker, and load_config, which checks the names a config picks)
# ----------------------------------------------------------------------------------------


@hookspec
def register_writers(registry: "Registry") -> None:
    """Register commit-log writers.

    :param registry: ``registry.add(name, factory)`` with a
        :data:`~mqstore.plugin_api.contracts.WriterFactory`: ``factory(ctx: WriterContext) -> Writer``.
        The YAML key ``writer.kind`` picks one by name.

    Runs in: every process that builds a plugin manager; the writer works in the store
    process.
    """


@hookspec
def register_queue_selectors(registry: "Registry") -> None:
    """Register queue selectors for puts without a queue id.

    :param registry: ``registry.add(name, factory)`` with a
        :data:`~mqstore.plugin_api.contracts.QueueSelectorFactory`:
        ``factory(config, string_hash) -> QueueSelector``. The YAML key
        ``queue_select.selector`` picks one.

    Runs in: every process that builds a plugin manager; the selector works in the store
    process.
    """


@hookspec
def register_filters(registry: "Registry") -> None:
    """Register subscription filter types, by expression type (case-insensitive).

    :param registry: ``registry.add(expression_type, factory)`` with a
        :data:`~mqstore.plugin_api.contracts.FilterFactory`: ``factory(expression, string_hash) ->
        Filter``; a filter declaring ``PRECOMPUTES`` gets bitmaps at dispatch for registered
        subscriptions. ``store.get(..., expression_type=NAME)`` uses it.

    Runs in: every process that serves pulls or dispatches.
    """


@hookspec
def register_dispatchers(registry: "Registry") -> None:
    """Register dispatchers (the consume-queue builder, index builders).

    :param registry: ``registry.add(name, factory)`` with a
        :data:`~mqstore.plugin_api.contracts.DispatcherFactory`: ``factory(view: StoreView, role) ->
        Dispatcher | None``. Every registered dispatcher runs, in registration order.

    Runs in: every process of the store, once each, with that process's role (``writer`` in
    the dispatch loop's process, ``follower`` beside it, ``reader`` in read-only stores).
    """


@hookspec
def register_flush_policies(registry: "Registry") -> None:
    """Register flush policies.

    :param registry: ``registry.add(name, factory)`` with a
        :class:`~mqstore.plugin_api.contracts.FlushPolicyFactory`: ``factory(config, flusher) ->
        FlushPolicy`` plus ``factory.schedule(config) -> FlushSchedule``. The YAML key
        ``flush.policy`` picks one.

    Runs in: the store process (the policy) and the flush loop's process (the schedule).
    """


@hookspec
def register_cleanup_policies(registry: "Registry") -> None:
    """Register cleanup policies: when commit-log segments go and when the disk is full.

    :param registry: ``registry.add(name, factory)`` with a
        :data:`~mqstore.plugin_api.contracts.CleanupPolicyFactory`: ``factory(config) ->
        CleanupPolicy``. The YAML key ``cleanup.policy`` picks one (default ``rocketmq``).

    Runs in: every process that builds a plugin manager; the policy decides in the store
    process, every ``cleanup.interval_ms``, with the store clock's time.
    """


@hookspec
def register_allocation_strategies(registry: "Registry") -> None:
    """Register how the instances of a consumer group split a topic's queues.

    :param registry: ``registry.add(name, factory)`` with a
        :data:`~mqstore.plugin_api.contracts.AllocationStrategyFactory`: ``factory() ->
        AllocationStrategy``. The YAML key ``consumer.allocation`` picks one (default
        ``average``, RocketMQ's AllocateMessageQueueAveragely); ``store.consumer(...,
        allocation=NAME)`` picks one for a consumer.

    Runs in: every process that builds a plugin manager; ``allocate`` runs in each consumer's
    process, on the thread calling ``poll``, whenever the group's members or queues change.
    """


# ----------------------------------------------------------------------------------------
# Append hooks: the store process, on the calling thread, once per put / put_batch
# ----------------------------------------------------------------------------------------


@hookspec
def before_append(messages: "Sequence[Message] | MessageBatch") -> None:
    """Called before the messages are validated and written; raise to reject the whole call.

    :param messages: the put's messages (a ``MessageBatch`` for a columnar put_batch).

    Runs in: the store process, the caller's thread, outside the put lock.
    """


@hookspec
def after_append(result: "BatchPutResult") -> None:
    """Called after a put or put_batch wrote its records (also for a rejected call).

    :param result: statuses, queue ids and offsets, commit-log offsets and sizes.

    Runs in: the store process, the caller's thread, outside the put lock.
    """


# ----------------------------------------------------------------------------------------
# Dispatch hooks: the dispatch loop, once per batch of records
# ----------------------------------------------------------------------------------------


@hookspec
def after_dispatch(batch: "DispatchBatch") -> None:
    """Called after every dispatcher has processed ``batch``; raising retries the batch.

    :param batch: the records' columns (``mqstore.plugin_api.DispatchBatch``).

    Runs in: the dispatch loop (the dispatch worker process, or a thread of the store process
    with ``dispatch.worker: thread``).
    """


# ----------------------------------------------------------------------------------------
# Flush hooks: the flush loop
# ----------------------------------------------------------------------------------------


@hookspec
def after_flush(flushed_offset: int) -> None:
    """Called after the commit log was forced to disk.

    :param flushed_offset: every byte below it is on disk.

    Runs in: the flush loop (the flush worker process, or a thread of the store process with
    ``flush.worker: thread``).
    """


# ----------------------------------------------------------------------------------------
# Cleanup hooks: after old commit-log segments were deleted
# ----------------------------------------------------------------------------------------


@hookspec
def after_cleanup(min_phys_offset: int) -> None:
    """Called once a cleanup finished: the commit log below ``min_phys_offset`` was deleted,
    and the consume queues and every dispatcher declaring ``DROPS_OLD_FILES`` have dropped
    their files below it.

    :param min_phys_offset: the new first stored commit-log byte.

    Runs in: the dispatch loop's process (it owns the files that follow the commit log).
    """


__all__ = [
    "hookspec", "hookimpl", "register_writers", "register_queue_selectors", "register_filters",
    "register_dispatchers", "register_flush_policies", "register_cleanup_policies",
    "register_allocation_strategies",
    "before_append", "after_append",
    "after_dispatch", "after_flush", "after_cleanup",
]
