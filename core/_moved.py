"""Import paths that moved after 0.1.0, kept for one release with a DeprecationWarning.

``import mqstore.hookspecs`` (or ``from mqstore import hookspecs``) still works and warns,
naming the new path; the module object is the new one, so state is not duplicated.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {  # old module -> new module
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
}
# Old names that are packages now: their submodules moved with them.
_MOVED_PACKAGES = {"mqstore.workers": "mqstore.runtime.workers"}


def new_name(old: str) -> str | None:
    if old in MOVED:
        return MOVED[old]
    for pkg, new in _MOVED_PACKAGES.items():
        if old.startswith(pkg + "."):
            return new + old[len(pkg):]
    return None


def warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(f"{old} moved to {new}; the old import path goes in the next release",
                  DeprecationWarning, stacklevel=stacklevel)


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:
        pass  # the new module is already executed; the old name now names it


class MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        warn(fullname, new, stacklevel=3)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
