"""Registers the core's transient-pool writer under ``writer.kind: transient_pool``.

Staging writes in shared memory that another process commits is core, not a plugin seam: the
writer, its pool and the pool's life across the store's processes (salvage at open, commits in
the flush loop, keep-or-remove at close) live in ``mqstore.append.pool_writer``. This plugin only
makes the kind selectable, as ``writer_mmap`` does for the plain default; disabling it leaves
``transient_pool`` unregistered.
"""

from __future__ import annotations

from mqstore.plugin_api import STAGING_WRITER, hookimpl


@hookimpl(trylast=True)
def register_writers(registry):
    registry.add("transient_pool", STAGING_WRITER)
