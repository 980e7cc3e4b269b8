"""``mqstore check [--fix]``: the commit log walked record by record (``log_walk``), the
derived files cross-checked against it (``queues``, ``index``), one ``problems.Problem`` per
damaged place (``checker`` runs it all), and the repair (``repair``)."""
