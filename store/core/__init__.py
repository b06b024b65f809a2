"""The engine: the six operations, the lifecycle, the read path, the journal's ledger, keys and
encryption, projection upkeep, and the engine's own locks and clock. May import ``store.screen``,
``store.backend``, ``store.opening``, ``retrieval`` and ``models``."""
