"""The dispatchers one process builds, with what each declares it can do.

The core's consume-queue builder comes first wherever consume queues are written (the
``writer`` role), then the state mirror's applier (``mirror.applier``: it applies while the
store is a slave), then
every registered dispatcher in the registry's order. Dispatchers report
how far their forced files reach through their contract (``CHECKPOINTS``); only the core writes
those times into the checkpoint (``view.checkpoint``).
"""

from __future__ import annotations

import os

from mqstore.dispatch.consume_queue_builder import ConsumeQueueBuilder
from mqstore.errors import PluginError
from mqstore.mirror.applier import StateApplier
from mqstore.plugin_api.contracts import (
    CHECKPOINTS, DROPS_OLD_FILES, LOOKS_UP_KEYS, PERSISTS, RESUMES, WRITER, CapabilityError, Role,
    check_capabilities,
)
from mqstore.storage.role_file import read_role, role_path


class RecordedRole:
    """Whether the store is a slave now, as another process decided: ``role.json`` (a
    promotion or a demotion at run time) wins over ``store.role``; read again when it
    changes, so a dispatch worker follows its writer's role changes."""

    def __init__(self, root: str, configured: str) -> None:
        self._path = role_path(root)
        self._root = root
        self._configured = configured
        self._seen: tuple[int, int] | None = None
        self._slave = configured == "slave"

    def is_slave(self) -> bool:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return self._configured == "slave"
        key = (st.st_mtime_ns, st.st_ino)
        if key != self._seen:
            record, _problem = read_role(self._root)
            # A damaged file is the open's to report; meanwhile the configured role holds.
            self._slave = (record.role if record is not None else self._configured) == "slave"
            self._seen = key
        return self._slave


class Dispatchers:
    """Built once per process from the ``register_dispatchers`` registry, in its order."""

    def __init__(self, registry, view, role: Role) -> None:
        self.role = role
        self.view = view
        self.items: list = []
        self._declared: list[frozenset[str]] = []
        self.queue_builder: ConsumeQueueBuilder | None = None
        if role == WRITER:
            self.queue_builder = ConsumeQueueBuilder(view)
            self.items.append(self.queue_builder)
            self._declared.append(frozenset())
            # Every writer has one: a master demoted at run time follows without a new
            # dispatcher, and a promoted slave's stops as its role changes (role.json).
            self.items.append(StateApplier(view, following=RecordedRole(
                view.root, view.config.store.role).is_slave))
            self._declared.append(StateApplier.capabilities)
        try:
            for name, factory in registry.items():
                dispatcher = factory(view, role)
                if dispatcher is None:
                    continue
                self.items.append(dispatcher)
                try:
                    self._declared.append(check_capabilities(dispatcher, f"dispatcher {name!r}"))
                except CapabilityError as exc:
                    raise PluginError(str(exc)) from None
        except BaseException:
            self.close()
            raise
        self._checkpointing = self._with(CHECKPOINTS)

    def _with(self, capability: str) -> list:
        return [d for d, caps in zip(self.items, self._declared) if capability in caps]

    def dispatch(self, batch) -> None:
        """Every dispatcher, in order; then the times they report go to the checkpoint."""
        for dispatcher in self.items:
            dispatcher.dispatch(batch)
        self.record_times()

    def record_times(self) -> None:
        checkpoint = self.view.checkpoint
        if self.queue_builder is not None and self.queue_builder.last_store_timestamp:
            checkpoint.logics_msg_timestamp = self.queue_builder.last_store_timestamp
        if self._checkpointing:
            times = [d.checkpoint_time() for d in self._checkpointing]
            if min(times) > 0:
                checkpoint.index_msg_timestamp = min(times)

    def resume_offsets(self) -> list[int]:
        return [d.resume_offset() for d in self._with(RESUMES)]

    def key_lookup(self):
        """The first dispatcher that answers key lookups, or None."""
        found = self._with(LOOKS_UP_KEYS)
        return found[0] if found else None

    def drop_below(self, min_phys_offset: int) -> list[str]:
        removed: list[str] = []
        for d in self._with(DROPS_OLD_FILES):
            removed += d.drop_below(min_phys_offset)
        return removed

    def persist(self) -> None:
        for d in self._with(PERSISTS):
            d.persist()
        self.record_times()

    def close(self) -> None:
        items, self.items, self._declared = self.items, [], []
        for d in items:
            d.close()

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
