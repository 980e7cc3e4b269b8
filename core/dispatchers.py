"""The dispatchers one process builds, with what each declares it can do."""

from __future__ import annotations

from mqstore.contracts import (
    DROPS_OLD_FILES, LOOKS_UP_KEYS, PERSISTS, RESUMES, CapabilityError, Role, StoreView,
    check_capabilities,
)
from mqstore.errors import PluginError


class Dispatchers:
    """Built once per process from the ``register_dispatchers`` registry, in its order."""

    def __init__(self, registry, view: StoreView, role: Role) -> None:
        self.role = role
        self.items: list = []
        self._declared: list[frozenset[str]] = []
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

    def _with(self, capability: str) -> list:
        return [d for d, caps in zip(self.items, self._declared) if capability in caps]

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

    def close(self) -> None:
        items, self.items, self._declared = self.items, [], []
        for d in items:
            d.close()

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
