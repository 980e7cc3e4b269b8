"""``mqstore.indexed``: how much of the key index is known to be on disk, so a recovery after
a crash re-indexes only what came later instead of rebuilding the newest index file.

RocketMQ keeps only the end time of the last full index file (the checkpoint's index time):
after a crash it deletes every newer file and indexes their records again, up to a whole
file (20M keys by default). The key index forces its newest file to disk from time to time
and then records, in this sealed JSON file (``sealed_json``) in the store root:

    +----------------+-----------------------------------------------------------------+
    | key            | value                                                           |
    +----------------+-----------------------------------------------------------------+
    | format         | 1                                                               |
    | file           | name of the newest file in ``index/`` then; null for none      |
    | header         | its 6 header fields as forced to disk (null with no file)       |
    | indexed_until  | commit-log offset: every record below it has its keys in the    |
    |                | files up to ``file`` as they were then                          |
    +----------------+-----------------------------------------------------------------+

After a crash, ``file`` is rolled back to ``header`` (``IndexFile.roll_back``), newer files
are deleted, and indexing resumes at ``indexed_until``. RocketMQ never reads this file and
no RocketMQ file changes because of it.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from mqstore.format.index_layout import IndexHeader
from mqstore.storage.sealed_json import read_sealed, write_sealed

PROGRESS_FILE = "mqstore.indexed"
PROGRESS_FORMAT = 1


class IndexProgress(NamedTuple):
    file: str | None
    header: IndexHeader | None
    indexed_until: int


def progress_path(root: str) -> str:
    return os.path.join(root, PROGRESS_FILE)


def write_progress(root: str, progress: IndexProgress) -> None:
    write_sealed(progress_path(root), {
        "format": PROGRESS_FORMAT, "file": progress.file,
        "header": None if progress.header is None else list(progress.header),
        "indexed_until": progress.indexed_until})


def read_progress(root: str) -> tuple[IndexProgress | None, str | None]:
    """The recorded progress, or None and why it cannot be used (None, None: no file)."""
    path = progress_path(root)
    body, problem = read_sealed(path)
    if body is None:
        return None, problem
    name, header, until = body.get("file"), body.get("header"), body.get("indexed_until")
    if (body.get("format") != PROGRESS_FORMAT or not isinstance(until, int) or until < 0
            or (name is None) != (header is None)
            or (name is not None and not (isinstance(name, str) and name.isdigit()))
            or (header is not None and not (isinstance(header, list) and len(header) == 6
                                            and all(isinstance(v, int) for v in header)))):
        return None, f"{path} is malformed"
    return IndexProgress(name, None if header is None else IndexHeader(*header), until), None
