"""Master/slave replication of the commit log over RocketMQ's own HA protocol.

``service.Replication`` is a writable store's replication by its role; ``master`` and ``slave``
speak the protocol (``format.ha_frame``), ``receiver`` appends a master's records to a slave's
log, ``acks`` is the SYNC_MASTER wait the Appender calls after every put. docs/replication.md
describes roles, configuration, guarantees and faults.
"""

from mqstore.replication.acks import SlaveAcks
from mqstore.replication.receiver import ReplicaDiverged
from mqstore.replication.service import Replication, slave_acks

__all__ = ["Replication", "SlaveAcks", "ReplicaDiverged", "slave_acks"]
