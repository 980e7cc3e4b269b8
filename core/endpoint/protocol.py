"""The generated protobuf messages and gRPC service of ``apache.rocketmq.v2``, loaded from the
official Python client's package (``rocketmq.grpc_protocol``): no generated code lives in
this repository.

NOTE [ Loading the stubs ]
``import rocketmq.grpc_protocol`` first runs ``rocketmq/__init__.py``, which imports the whole
client, and the client's logging module then creates ``~/logs/rocketmq_python`` and installs a
logging configuration: a server started without a writable home directory would fail to
import, and every server would write a client's log directory. The stubs themselves import
only protobuf, grpc and each other. So the server imports them under a bare ``rocketmq``
package object (the package found, its ``__init__`` not run), then takes that object out of
``sys.modules``: a later ``import rocketmq`` (a client in the same process) runs the real
``__init__``, which finds the stub modules already loaded and uses them (``from
rocketmq.grpc_protocol import ...``, as the client imports them, works; the package attribute
``rocketmq.grpc_protocol`` stays unset in such a process).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

PACKAGE = "rocketmq"
STUBS = "rocketmq.grpc_protocol"
EXTRA_HINT = "install the grpc extra: pip install 'mqstore[grpc]'"


def _load_stubs():
    if PACKAGE in sys.modules:  # the client is loaded already: its stubs are too
        return importlib.import_module(STUBS)
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"the gRPC endpoint needs the rocketmq-python-client package "
                          f"({EXTRA_HINT})")
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)  # NOTE [ Loading the stubs ]
    try:
        return importlib.import_module(STUBS)
    finally:
        del sys.modules[PACKAGE]


_stubs = _load_stubs()
definition_pb2 = _stubs.definition_pb2
service_pb2 = _stubs.service_pb2
service_pb2_grpc = _stubs.service_pb2_grpc

Code = definition_pb2.Code
Status = definition_pb2.Status
Resource = definition_pb2.Resource
Message = definition_pb2.Message
Settings = definition_pb2.Settings
ClientType = definition_pb2.ClientType

__all__ = ["definition_pb2", "service_pb2", "service_pb2_grpc", "Code", "Status", "Resource",
           "Message", "Settings", "ClientType"]
