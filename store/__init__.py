"""The source of truth, over two backends behind ``store/backend.py``'s protocols.

``core/`` the engine and lifecycle; ``screen/`` the admission policy and secrets screen; ``host/`` the
host's operations on a scope; ``console/`` what the operator console reads and does; ``maintenance/``
backup, verify, rebuild, rotation; ``duckdb/`` (the embedded default) and ``postgres/`` (one database
shared by several nodes) implement the protocols, and ``opening.py`` is the one place that picks one.
May import ``retrieval`` and ``models``; never ``server``."""
