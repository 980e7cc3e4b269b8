"""``config/mqstore_timers.json`` on disk (the document: ``format.timer_progress``), replaced
whole by the schedule thread alone, as ``storage.delay_offsets`` replaces its file."""

from __future__ import annotations

import os

from mqstore.format.timer_progress import TimerProgress, decode, encode
from mqstore.storage.durable_file import read_document, replace_file

CONFIG_DIR = "config"
TIMERS_FILE = "mqstore_timers.json"


def timer_progress_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, TIMERS_FILE)


def read_timer_progress(root: str) -> TimerProgress | None:
    path = timer_progress_path(root)
    return read_document(path, decode, lambda problem: (
        f"{path}: {problem}; the timers deliver nothing until it is repaired"))


def write_timer_progress(root: str, progress: TimerProgress) -> None:
    os.makedirs(os.path.join(root, CONFIG_DIR), exist_ok=True)
    replace_file(timer_progress_path(root), encode(progress).encode("utf-8"), fsync=True)
