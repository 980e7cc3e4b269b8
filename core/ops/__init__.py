"""Operator tools behind the ``mqstore`` command line: inspecting files, checking and repairing
a store, its statistics and metrics, the ``serve`` deployment, the throughput benchmark and the
generated references. Nothing here parses arguments or prints: ``mqstore.cli`` does that."""
