"""Whole-store maintenance: backup and restore, verify, rebuild of the projections, master-key
rotation. May import ``store.core``, ``store.host``, ``store.backend``, ``store.opening``,
``retrieval`` and ``models``."""
