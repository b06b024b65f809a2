"""What the operator console (server/console/) reads of a store and the operations it runs.
May import ``store.core``, ``store.host``, ``store.maintenance``, ``store.backend``, ``retrieval`` and
``models``."""
