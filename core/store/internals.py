"""What tools and tests reach beneath the facade (``MessageStore.internals``).

Not the public API: these are the parts an open built (``lifecycle.parts.StoreParts``), and
they change as the parts do. The names the facade once had for them (``store.commit_log``,
``store.flush_client``, ...) still work until ``REMOVED_IN``, warning once per use.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from mqstore._moved import REMOVED_IN

if TYPE_CHECKING:
    from mqstore.dispatch.dispatchers import Dispatchers
    from mqstore.lifecycle.parts import StoreParts
    from mqstore.plugin_api.contracts import Writer
    from mqstore.plugin_api.manager import PluginHooks
    from mqstore.runtime.loops import Runtime
    from mqstore.runtime.workers.flush_client import FlushClient
    from mqstore.runtime.workers.shm import Channels
    from mqstore.runtime.workers.supervisor import DispatchSupervisor
    from mqstore.storage.commit_log import CommitLog

T = TypeVar("T")


class StoreInternals:
    """The parts of one open store, for tools and tests."""

    def __init__(self, parts: StoreParts) -> None:
        assert parts.commit_log is not None and parts.dispatchers is not None
        assert parts.hooks is not None
        self._parts = parts

    @property
    def commit_log(self) -> CommitLog:
        assert self._parts.commit_log is not None  # set by every open that returned
        return self._parts.commit_log

    @property
    def dispatchers(self) -> Dispatchers:
        """This process's dispatchers (the key index's lookups among them)."""
        assert self._parts.dispatchers is not None
        return self._parts.dispatchers

    @property
    def hooks(self) -> PluginHooks:
        assert self._parts.hooks is not None
        return self._parts.hooks

    @property
    def runtime(self) -> Runtime | None:
        """The loops of a writable store (None when read-only)."""
        return self._parts.runtime

    @property
    def flush_client(self) -> FlushClient | None:
        runtime = self._parts.runtime
        return runtime.flush_client if runtime is not None else None

    @property
    def writer(self) -> Writer | None:
        runtime = self._parts.runtime
        return runtime.writer if runtime is not None else None

    @property
    def supervisor(self) -> DispatchSupervisor | None:
        """The dispatch worker's supervisor (``dispatch.worker: process``), or None."""
        runtime = self._parts.runtime
        return runtime.supervisor if runtime is not None else None

    @property
    def channels(self) -> Channels | None:
        runtime = self._parts.runtime
        return runtime.channels if runtime is not None else None


class MovedToInternals(Generic[T]):
    """A facade attribute that moved to ``MessageStore.internals``: it still answers, with a
    DeprecationWarning naming the new place and the release that removes it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, store: None, owner: type | None = None) -> MovedToInternals[T]: ...

    @overload
    def __get__(self, store: object, owner: type | None = None) -> T: ...

    def __get__(self, store: object, owner: type | None = None) -> Any:
        if store is None:
            return self
        warnings.warn(f"MessageStore.{self.name} is internal: use "
                      f"MessageStore.internals.{self.name}; the old name goes in mqstore "
                      f"{REMOVED_IN}", DeprecationWarning, stacklevel=2)
        return getattr(getattr(store, "internals"), self.name)
