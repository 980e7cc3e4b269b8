"""Model-based test: random puts, batches, reopens and crashes against a list model."""

import pytest
from hypothesis import settings

from mqstore.testing import StoreStateMachine


class SmallSegments(StoreStateMachine):
    pass


class SyncFlushMmh3(StoreStateMachine):
    overrides = {"commit_log": {"segment_bytes": 2048}, "consume_queue": {"file_units": 5},
                 "flush": {"policy": "sync", "worker": "thread"}, "store": {"hash": "mmh3"},
                 "dispatch": {"worker": "thread"}, "plugins": {"load_entry_points": False}}


class TransientPoolWriter(StoreStateMachine):
    overrides = {"commit_log": {"segment_bytes": 4096}, "consume_queue": {"file_units": 8},
                 "writer": {"kind": "transient_pool", "transient_pool_buffers": 2,
                            "commit_interval_ms": 20},
                 "dispatch": {"worker": "thread"}, "flush": {"worker": "thread"},
                 "plugins": {"load_entry_points": False}}


class DispatchWorkerProcess(StoreStateMachine):
    overrides = {"commit_log": {"segment_bytes": 4096}, "consume_queue": {"file_units": 8},
                 "dispatch": {"worker": "process"}, "plugins": {"load_entry_points": False}}


TestSmallSegments = pytest.mark.slow(SmallSegments.TestCase)
TestSmallSegments.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
TestSyncFlushMmh3 = SyncFlushMmh3.TestCase
TestSyncFlushMmh3.settings = settings(max_examples=15, stateful_step_count=15, deadline=None)
TestTransientPoolWriter = TransientPoolWriter.TestCase
TestTransientPoolWriter.settings = settings(max_examples=15, stateful_step_count=15, deadline=None)
TestDispatchWorkerProcess = DispatchWorkerProcess.TestCase
TestDispatchWorkerProcess.settings = settings(max_examples=4, stateful_step_count=8, deadline=None)
