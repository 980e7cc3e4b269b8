"""What an ``Appender`` is built with, besides the files it writes: its fixed settings, the
plugins a put consults, and the loops it reports to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mqstore.append import encoding
from mqstore.config import parse_delay_levels

if TYPE_CHECKING:
    from mqstore.append.replicas import Replicas
    from mqstore.config import StoreConfig
    from mqstore.format.hosts import Host
    from mqstore.plugin_api.contracts import FlushPolicy, QueueSelector
    from mqstore.plugin_api.manager import PluginHooks


@dataclass(frozen=True)
class AppendSettings:
    """What puts are checked and encoded with, fixed for the store's life."""

    put_ctx: encoding.PutContext
    store_host: Host
    busy_timeout_ms: int
    disk_warning_ratio: float
    queues_per_topic: int
    selector_name: str
    max_delay_level: int = 0  # the highest delay level (store.message_delay_levels)
    timer_max_delay_ms: int = 0  # RocketMQ 5's timers (store.timer_*)
    timer_precision_ms: int = 1000

    @classmethod
    def of(cls, config: StoreConfig, store_host: Host) -> AppendSettings:
        log = config.commit_log
        return cls(
            encoding.PutContext(store_host, log.max_message_bytes, log.auto_v2_on_long_topic,
                                store_host.is_v6, log.record_crc),
            store_host, config.store.os_page_cache_busy_timeout_ms,
            config.cleanup.disk_warning_ratio, config.queue_select.queues_per_topic,
            config.queue_select.selector,
            len(parse_delay_levels(config.store.message_delay_levels)),
            config.store.timer_max_delay_sec * 1000, config.store.timer_precision_ms)


@dataclass(frozen=True)
class PutStrategies:
    """The plugins a put consults: where a message goes, when its put completes, the hooks
    around it, and a master's slaves (``append.replicas``; None: no replication)."""

    selector: QueueSelector
    flush_policy: FlushPolicy
    hooks: PluginHooks
    replicas: Replicas | None = None


class Loops(Protocol):
    """What the Appender tells the loops of the store (``runtime.loops.Runtime``) and asks
    them."""

    def failing(self) -> str | None:
        """Why the loops cannot do their work now (puts wait), or None."""

    def appended(self, end: int) -> None:
        """After each append, with the new end of the log: publish it, wake the loops."""
