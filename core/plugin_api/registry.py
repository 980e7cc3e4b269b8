"""Named registries that registration hooks fill and the store looks strategies up in."""

from __future__ import annotations

from typing import Any, Callable

from mqstore.errors import PluginError


class Registry:
    """Maps names to factories for one kind of strategy (writers, filters, ...).

    ``setting`` is the dotted config key that picks one by name (``"writer.kind"``), if any;
    lookup errors start with it so the user knows which line of the config to fix.
    """

    def __init__(self, kind: str, *, key: Callable[[str], str] = lambda n: n,
                 setting: str | None = None, reserved: dict[str, str] | None = None) -> None:
        """``reserved``: names no plugin may register, each with what the core uses it for."""
        self.kind = kind
        self.setting = setting
        self._reserved = {key(n): why for n, why in (reserved or {}).items()}
        self._key = key
        self._factories: dict[str, Callable[..., Any]] = {}
        self._owners: dict[str, str] = {}  # name -> plugin name
        self._sources: dict[str, str] = {}  # name -> where that plugin came from, for messages
        self.current_plugin = "?"
        self.current_source = "?"

    def add(self, name: str, factory: Callable[..., Any]) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"{self.kind} name {name!r} must be a non-empty string")
        if not callable(factory):
            raise PluginError(f"{self.kind} {name!r}: factory {factory!r} is not callable")
        key = self._key(name)
        if key in self._reserved:
            raise PluginError(f"{self.kind} name {name!r} (registered by {self.current_source}) "
                              f"is reserved: {self._reserved[key]}; register it under another "
                              f"name")
        if key in self._factories:
            # Silently keeping one of two would change what a config name selects depending
            # on which packages happen to be installed.
            raise PluginError(f"{self.kind} {name!r} is registered twice: by "
                              f"{self._sources[key]} and by {self.current_source}; each name "
                              f"has one owner (rename one, or block one with plugins.disable)")
        self._factories[key] = factory
        self._owners[key] = self.current_plugin
        self._sources[key] = self.current_source

    def get(self, name: str) -> Callable[..., Any]:
        try:
            return self._factories[self._key(name)]
        except KeyError:
            raise PluginError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        where = f"{self.setting}: " if self.setting else ""
        known = ", ".join(sorted(self._factories)) or "none"
        return f"{where}unknown {self.kind} {name!r}; registered: {known}"

    def owner(self, name: str) -> str:
        return self._owners[self._key(name)]

    def names(self) -> list[str]:
        return list(self._factories)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._factories.items())

    def __contains__(self, name: str) -> bool:
        return self._key(name) in self._factories
