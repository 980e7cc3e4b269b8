"""The state mirror: a slave's copy of its master's state files, carried in the commit log.

NOTE [ State mirror ]
State that travels in the commit log replicates exactly, in log order with the messages, and
needs no second protocol. So every change of the store's own state files (the registry of
``storage.state_files``: topic configs, deleted topics, consumer offsets and their journal,
the groups' offset marks, pop checkpoints and journals, registered subscriptions) is also
written to the commit log, as messages of the system topic ``rmq_sys_MQSTORE_STATE``
(``format.state_record``), and a slave's dispatch applies them to a mirror of those files.

    master, any process       a change of a state file appends its path to the change feed
                              (``storage.state_feed``), under the file's own lock
    master, writer process    ``shipper.StateShipper`` reads the feed, reads each changed unit
                              under its owner's lock, and puts the operations (write: the bytes
                              a journal grew; put: a file whole; delete) through the store's
                              put path, so a sync_master's put waits for a slave as any does;
                              a full snapshot (every file, bracketed by snapshot-begin and
                              snapshot-end naming every path) when it starts and whenever a
                              slave connects
    slave, dispatch           ``applier.StateApplier`` applies the operations, in log order and
                              idempotently, to ``<root>/replica/``; ``replica/state.json``
                              (``replica_state``) records the last snapshot completed there
    promotion                 ``install.install_mirror_files``: the slave's own state files
                              go aside (``replica-previous/<time>/``) and the mirror's files
                              take their place

The mirror copies bytes, not meanings: a promoted slave reads its state with exactly the code
the master used, and the two compare byte for byte. What a slave holds trails the master by
the ship interval for changes of other processes (``store.ha_state_ship_interval_ms``); the
writer process's acks and commits are shipped before they are answered (``ship_now``), so
under sync_master an ack answered OK is on a slave.
"""
