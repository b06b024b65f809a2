"""The host's operations on a scope, never agent tools: lifecycle operations, adjudication, approvals,
expiry, history, export/import, and receipts explained. May import ``store.core``, ``store.screen``,
``store.backend``, ``store.opening``, ``retrieval`` and ``models``."""
