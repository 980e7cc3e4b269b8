"""Import paths and names that moved, kept until ``REMOVED_IN`` with a DeprecationWarning.

``import mqstore.hookspecs`` (or ``from mqstore import hookspecs``) still works and warns,
naming the new path; the module object is the new one, so state is not duplicated. A name
that moved out of a module that stays (``mqstore.storage.checkpoint.read_meta``) is found by
that module's ``__getattr__`` (``moved_attribute``), which warns the same way.

The paths moved in two steps, both released in 0.2.0 (the layer packages, then the ops
packages, the storage split and the store package); every old path goes in ``REMOVED_IN``,
the next minor release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

REMOVED_IN = "0.3.0"

MOVED = {  # old module -> new module
    # the layer packages
    "mqstore.appender": "mqstore.append.encoding",
    "mqstore.appending": "mqstore.append.appender",
    "mqstore.batch_columns": "mqstore.append.columns",
    "mqstore.pool_writer": "mqstore.append.pool_writer",
    "mqstore.cleanup": "mqstore.runtime.cleanup",
    "mqstore.workers": "mqstore.runtime.workers",
    "mqstore.derived_flush": "mqstore.dispatch.derived_flush",
    "mqstore.dispatchers": "mqstore.dispatch.dispatchers",
    "mqstore.subscriptions": "mqstore.view.subscriptions",
    "mqstore.store_view": "mqstore.view.directory_view",
    "mqstore.message_reader": "mqstore.view.checked_read",
    "mqstore.pull": "mqstore.read.pull",
    "mqstore.pull_plain": "mqstore.read.plain_pull",
    "mqstore.pull_rows": "mqstore.read.served_rows",
    "mqstore.pull_runs": "mqstore.read.segment_runs",
    "mqstore.record_fields": "mqstore.read.fields",
    "mqstore.time_search": "mqstore.read.time_search",
    "mqstore.time_index": "mqstore.read.time_cache",
    "mqstore.unit_rescue": "mqstore.read.unit_rescue",
    "mqstore.reading": "mqstore.read.reader",
    "mqstore.read_batch": "mqstore.message",
    "mqstore.opening": "mqstore.lifecycle.opener",
    "mqstore.recovery": "mqstore.lifecycle.recovery",
    "mqstore.store_meta": "mqstore.lifecycle.store_meta",
    "mqstore.file_locks": "mqstore.storage.file_locks",
    "mqstore.contracts": "mqstore.plugin_api.contracts",
    "mqstore.hookspecs": "mqstore.plugin_api.hookspecs",
    "mqstore.registry": "mqstore.plugin_api.registry",
    "mqstore.plugins_manager": "mqstore.plugin_api.manager",
    "mqstore.filtering": "mqstore.plugin_api.filtering",
    "mqstore.ops.reference": "mqstore.cli.reference",
    # inspection and checking as packages of ops; the store's topic calls beside the facade
    "mqstore.ops.inspect": "mqstore.ops.inspection.kinds",
    "mqstore.ops.inspect_commitlog": "mqstore.ops.inspection.commit_log",
    "mqstore.ops.inspect_queue": "mqstore.ops.inspection.queue_files",
    "mqstore.ops.inspect_small": "mqstore.ops.inspection.small_files",
    "mqstore.ops.check": "mqstore.ops.checking.checker",
    "mqstore.ops.check_log": "mqstore.ops.checking.log_walk",
    "mqstore.ops.check_queues": "mqstore.ops.checking.queues",
    "mqstore.ops.check_index": "mqstore.ops.checking.index",
    "mqstore.ops.problems": "mqstore.ops.checking.problems",
    "mqstore.ops.repair": "mqstore.ops.checking.repair",
    "mqstore.ops.uniq_keys": "mqstore.cli.uniq_keys",
    "mqstore.lifecycle.topic_calls": "mqstore.store.topic_calls",
    "mqstore.lifecycle.topic_removal": "mqstore.store.topic_removal",
}
# Old names that are packages now: their submodules moved with them.
_MOVED_PACKAGES = {"mqstore.workers": "mqstore.runtime.workers"}
# Names that moved out of a module that stays: (old module, name) -> new module.
MOVED_NAMES = {
    ("mqstore.storage.checkpoint", "ABORT_FILE"): "mqstore.storage.abort_file",
    ("mqstore.storage.checkpoint", "abort_exists"): "mqstore.storage.abort_file",
    ("mqstore.storage.checkpoint", "create_abort"): "mqstore.storage.abort_file",
    ("mqstore.storage.checkpoint", "remove_abort"): "mqstore.storage.abort_file",
    ("mqstore.storage.checkpoint", "META_FILE"): "mqstore.storage.meta_file",
    ("mqstore.storage.checkpoint", "read_meta"): "mqstore.storage.meta_file",
    ("mqstore.storage.checkpoint", "write_meta"): "mqstore.storage.meta_file",
    ("mqstore.storage.checkpoint", "write_small_file"): "mqstore.storage.durable_file",
    ("mqstore.storage.checkpoint", "LOCK_FILE"): "mqstore.storage.store_lock",
    ("mqstore.storage.checkpoint", "WORKER_EXIT_WAIT_S"): "mqstore.storage.store_lock",
    ("mqstore.storage.sealed_json", "sync_dir"): "mqstore.storage.durable_file",
}


def new_name(old: str) -> str | None:
    if old in MOVED:
        return MOVED[old]
    for pkg, new in _MOVED_PACKAGES.items():
        if old.startswith(pkg + "."):
            return new + old[len(pkg):]
    return None


def message(old: str, new: str) -> str:
    return f"{old} moved to {new}; the old path goes in mqstore {REMOVED_IN}"


def warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(message(old, new), DeprecationWarning, stacklevel=stacklevel)


def moved_attribute(module: str, name: str) -> object:
    """For a module's ``__getattr__``: the value of a name that moved out of ``module``,
    with a warning; AttributeError for any other name."""
    new = MOVED_NAMES.get((module, name))
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn(f"{module}.{name}", f"{new}.{name}", stacklevel=4)
    return getattr(importlib.import_module(new), name)


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the new module is already executed; the old name now names it


class MovedFinder(importlib.abc.MetaPathFinder):
    """Answers only for the old names above; every other import passes it at the cost of
    one prefix test."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("mqstore."):
            return None
        new = new_name(fullname)
        if new is None:
            return None
        warn(fullname, new, stacklevel=3)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
