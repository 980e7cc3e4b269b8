"""Builds a plugin manager for one store in one process, and the typed facade that calls it.

Loading order: the built-in modules in ``DEFAULT_PLUGINS``, then the extra modules named in
``plugins.modules``, then third-party packages from the ``mqstore`` entry-point group. Hooks run
in pluggy's order, the last registered first, and built-ins are ``trylast``. A name has one
owner: a second registration of a name is refused, naming both plugins (module, or entry point
and package), and names the core uses itself (``CORE_PARTS``) cannot be registered. Environment:
``MQSTORE_LOAD_PLUGINS`` is a comma-separated allow-list of entry-point names (empty: none);
``MQSTORE_DISABLE_PLUGINS`` blocks plugins by name, like ``plugins.disable``;
``MQSTORE_TRACE_PLUGINS=1`` logs every hook call.
"""

from __future__ import annotations

import importlib
import logging
import os
from importlib import metadata
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pluggy

from mqstore.errors import PluginConfigError, PluginError
from mqstore.plugin_api import hookspecs
from mqstore.plugin_api.registry import Registry

if TYPE_CHECKING:
    from mqstore.config import StoreConfig
    from mqstore.message import BatchPutResult, Message, MessageBatch, PutResult
    from mqstore.plugin_api.batch import DispatchBatch

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mqstore"
DEFAULT_PLUGINS = (
    "mqstore.plugins.writer_mmap",
    "mqstore.plugins.writer_transient",
    "mqstore.plugins.queue_select_round_robin",
    "mqstore.plugins.queue_select_random",
    "mqstore.plugins.queue_select_hash",
    "mqstore.plugins.filter_tag",
    "mqstore.plugins.filter_sql92",
    "mqstore.plugins.index_key",
    "mqstore.plugins.flush_async",
    "mqstore.plugins.flush_sync",
    "mqstore.plugins.allocate_average",
    "mqstore.plugins.allocate_average_by_circle",
    "mqstore.plugins.cleanup_keep_unconsumed",
    "mqstore.plugins.cleanup_rocketmq",
)


# Parts of the core that earlier releases loaded as plugins: naming one in plugins.disable is
# refused with the reason, not ignored.
CORE_PARTS = {
    "mqstore.plugins.cq_builder": "is no plugin: consume queues are built by the core's "
                                  "dispatch, always first, and cannot be disabled",
}
# Registry names the core keeps for itself.
RESERVED_DISPATCHERS = {
    "consume_queue": "the core's consume-queue builder (always first; it cannot be replaced)",
}


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return [item.strip() for item in raw.split(",") if item.strip()]


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, knowing where each registered plugin came from (``sources``)."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.sources: dict[str, str] = {}  # plugin name -> module, or entry point and package


def _register(pm: PluginManager, plugin: object, name: str, source: str) -> None:
    pm.sources[name] = source
    try:
        pm.register(plugin, name)
    except (pluggy.PluginValidationError, ValueError) as exc:
        raise PluginError(f"plugin {name!r} cannot be registered: {exc}") from None


def sources(pm: pluggy.PluginManager) -> dict[str, str]:
    """Where each registered plugin came from, by plugin name (module, or entry point and
    package), for messages that name a plugin; empty for a manager built elsewhere."""
    return pm.sources if isinstance(pm, PluginManager) else {}


def _entry_point_source(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    package = f"package {dist.name} {dist.version}" if dist is not None else "an unknown package"
    return f"entry point {ep.name!r} ({ep.value}) of {package}"


def plugin_names(modules: Sequence[str] = ()) -> list[str]:
    """Every name ``plugins.disable`` may block: the built-in modules, ``modules`` and the
    installed entry points, whether or not entry points are loaded (a disable list should not
    break when ``load_entry_points`` or ``MQSTORE_LOAD_PLUGINS`` changes)."""
    names = dict.fromkeys((*DEFAULT_PLUGINS, *modules))
    names.update(dict.fromkeys(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)))
    return list(names)


def make_plugin_manager(*, modules: Sequence[str] = (), disable: Sequence[str] = (),
                        load_entry_points: bool = True) -> PluginManager:
    pm = PluginManager()
    pm.add_hookspecs(hookspecs)
    blocked = set(disable) | set(_env_list("MQSTORE_DISABLE_PLUGINS") or ())
    for name in blocked:
        pm.set_blocked(name)
    for name in (*DEFAULT_PLUGINS, *modules):
        if pm.is_blocked(name) or pm.has_plugin(name):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise PluginError(f"plugin module {name!r} cannot be imported: {exc}") from None
        _register(pm, module, name, f"module {name}")
    if load_entry_points:
        allow = _env_list("MQSTORE_LOAD_PLUGINS")
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if (allow is not None and ep.name not in allow) or pm.is_blocked(ep.name):
                continue
            if pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party package must not hide the cause
                raise PluginError(
                    f"entry point {ep.name!r} ({ep.value}) of group {ENTRY_POINT_GROUP!r} "
                    f"failed to load: {exc!r}"
                ) from exc
            _register(pm, plugin, ep.name, _entry_point_source(ep))
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin implements an unknown hook: {exc}") from None
    if os.environ.get("MQSTORE_TRACE_PLUGINS") == "1":
        pm.trace.root.setwriter(log.debug)
        pm.enable_tracing()
    return pm


class PluginHooks:
    """Typed calls into the plugin manager; core code never calls ``pm.hook`` directly."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.writers = self._collect("writer", pm.hook.register_writers, setting="writer.kind")
        self.queue_selectors = self._collect("queue selector", pm.hook.register_queue_selectors,
                                             setting="queue_select.selector")
        self.filters = self._collect("filter", pm.hook.register_filters, key=str.upper)
        self.dispatchers = self._collect("dispatcher", pm.hook.register_dispatchers,
                                         reserved=RESERVED_DISPATCHERS)
        self.flush_policies = self._collect("flush policy", pm.hook.register_flush_policies,
                                            setting="flush.policy")
        self.cleanup_policies = self._collect("cleanup policy",
                                              pm.hook.register_cleanup_policies,
                                              setting="cleanup.policy")
        self.allocation_strategies = self._collect("allocation strategy",
                                                   pm.hook.register_allocation_strategies,
                                                   setting="consumer.allocation")
        # Cached so hot paths skip hooks nobody implements.
        self.has_before_append = bool(pm.hook.before_append.get_hookimpls())
        self.has_after_append = bool(pm.hook.after_append.get_hookimpls())
        self.has_after_dispatch = bool(pm.hook.after_dispatch.get_hookimpls())
        self.has_after_flush = bool(pm.hook.after_flush.get_hookimpls())
        self.has_after_cleanup = bool(pm.hook.after_cleanup.get_hookimpls())

    @property
    def selected(self) -> tuple[Registry, ...]:
        """The registries a config key picks one strategy from (``Registry.setting``)."""
        return (self.writers, self.queue_selectors, self.flush_policies, self.cleanup_policies,
                self.allocation_strategies)

    def _collect(self, kind: str, hook: Any, key: Callable[[str], str] = lambda n: n,
                 setting: str | None = None,
                 reserved: dict[str, str] | None = None) -> Registry:
        registry = Registry(kind, key=key, setting=setting, reserved=reserved)
        named = sources(self.pm)
        impls = hook.get_hookimpls()
        for impl in reversed(impls):  # pluggy's call order
            # One plugin at a time, so the registry knows who added what; through pluggy's
            # caller, so MQSTORE_TRACE_PLUGINS shows these calls too.
            others = [other.plugin for other in impls if other is not impl]
            registry.current_plugin = impl.plugin_name
            registry.current_source = named.get(impl.plugin_name, f"plugin {impl.plugin_name!r}")
            self.pm.subset_hook_caller(hook.name, remove_plugins=others)(registry=registry)
        registry.current_plugin = registry.current_source = "?"
        return registry

    def before_append(self, messages: Sequence[Message] | MessageBatch) -> None:
        if self.has_before_append:
            self.pm.hook.before_append(messages=messages)

    def after_append(self, result: PutResult | BatchPutResult) -> None:
        if self.has_after_append:
            self.pm.hook.after_append(result=result)

    def after_dispatch(self, batch: DispatchBatch) -> None:
        if self.has_after_dispatch:
            self.pm.hook.after_dispatch(batch=batch)

    def after_flush(self, flushed_offset: int) -> None:
        if self.has_after_flush:
            self.pm.hook.after_flush(flushed_offset=flushed_offset)

    def after_cleanup(self, min_phys_offset: int) -> None:
        if self.has_after_cleanup:
            self.pm.hook.after_cleanup(min_phys_offset=min_phys_offset)


def build_hooks(config: StoreConfig) -> PluginHooks:
    """The plugins ``config`` loads (``plugins.modules``, ``disable``, entry points), with
    every name the config picks among them checked: PluginConfigError listing all the
    problems at once, each naming its key."""
    p = config.plugins
    problems = _disable_problems(p.disable, p.modules)
    try:
        hooks = PluginHooks(make_plugin_manager(modules=p.modules, disable=p.disable,
                                                load_entry_points=p.load_entry_points))
    except PluginError as exc:
        raise PluginConfigError("; ".join([*problems, f"plugins: {exc}"])) from None
    for registry in hooks.selected:
        assert registry.setting is not None  # the selected registries name their key
        section, key = registry.setting.split(".")
        name = getattr(getattr(config, section), key)
        if name not in registry:
            problems.append(registry.unknown_message(name))
    if problems:
        raise PluginConfigError("; ".join(problems))
    return hooks


def check_config(config: StoreConfig, source: str = "the configuration") -> None:
    """``build_hooks``'s check alone, its error naming ``source`` (a file): for a tool that
    loads a configuration long before it opens a store."""
    try:
        build_hooks(config)
    except PluginConfigError as exc:
        raise PluginConfigError(f"invalid configuration in {source}: {exc}") from None


def _disable_problems(disable: Sequence[str], modules: Sequence[str]) -> list[str]:
    known = plugin_names(modules)
    return [f"plugins.disable: {name!r} {CORE_PARTS[name]}" if name in CORE_PARTS else
            f"plugins.disable: no plugin is named {name!r} (known: {', '.join(known)})"
            for name in dict.fromkeys(disable) if name not in known]
