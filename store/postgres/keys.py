"""``admin rotate-master-key`` on a PostgreSQL store: every wrapped key re-wrapped, in one transaction.

The data keys (``data_keys`` rows) and the page-cursor key (``meta``) are unwrapped with the old
master key and wrapped under the new one, and the store's fingerprint becomes the new key's, in
one commit: a failure leaves the store under the old key, whole. The data keys themselves do not
change (no sealed blob is rewritten), nor does the page-cursor key (page cursors stay valid).

A node holds its master key in memory from its start, so the rotation refuses while any node is
live (a heartbeat within NODE_LIVE_S): a node still running on the old key could not open a key
wrapped under the new one, and a key it created would be wrapped under the old. The operator
stops every node, rotates, replaces each node's key file with the new one, and restarts them; a
node started with the old key file is refused at launch (its fingerprint is not the store's)."""

from __future__ import annotations

from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.store.backend import LiveNodesError, StoreRefused
from engram_memory.store.core.crypto import unwrap, wrap
from engram_memory.store.postgres.backend import NODE_LIVE_S, SECRET_REF, fingerprint
from engram_memory.store.postgres.inspect import check_identity, connect

__all__ = ["LiveNodesError", "rotate_master_key"]  # LiveNodesError: store/backend.py's (server/ still imports it here)


def rotate_master_key(url: str, old_key: bytes, old_key_file: Path, new_key: bytes) -> int:
    """Re-wrap every key of the store from ``old_key`` to ``new_key``; returns how many data keys.

    Raises StoreRefused (not a store, ``old_key`` not its master key, a key that does not open:
    nothing changed) and LiveNodesError."""
    conn = connect(url)
    try:
        check_identity(conn, old_key, old_key_file)
        old, new = AESGCM(old_key), AESGCM(new_key)
        with conn.transaction():
            # No node starts (its identity check reads store_identity), beats or creates or destroys a
            # key until this commits; reads of data keys by running nodes go on meanwhile.
            conn.execute("LOCK TABLE store_identity, nodes, data_keys IN EXCLUSIVE MODE")
            row = conn.execute("SELECT master_key_fingerprint FROM store_identity").fetchone()
            if row is None or row[0] != fingerprint(old_key):  # rotated by another operator meanwhile
                raise StoreRefused(f"the master key file {old_key_file} is not this store's master key")
            live = conn.execute("SELECT count(*) FROM nodes WHERE heartbeat_at > now() - %s::interval",
                                [f"{NODE_LIVE_S} seconds"]).fetchone()
            if live is not None and int(live[0]):
                raise LiveNodesError(
                    f"{live[0]} node(s) of this store are running (a heartbeat within {NODE_LIVE_S} s); they hold"
                    " the old master key: stop every node, rotate, then restart each with the new key file")
            rows = conn.execute("SELECT key_ref, wrapped FROM data_keys ORDER BY key_ref").fetchall()
            secret = conn.execute("SELECT value FROM meta WHERE key = 'page_cursor_key'").fetchone()
            try:
                rewrapped = [(wrap(new, ref, unwrap(old, ref, bytes(blob))), ref) for ref, blob in rows]
                cursor_key = unwrap(old, SECRET_REF, bytes.fromhex(secret[0])) if secret else None
            except (InvalidTag, ValueError):
                raise StoreRefused("a key of the store does not open under the master key; nothing was changed"
                                   " (run: engram-memory admin verify)") from None
            with conn.cursor() as cur:
                cur.executemany("UPDATE data_keys SET wrapped = %s WHERE key_ref = %s", rewrapped)
            if cursor_key is not None:
                conn.execute("UPDATE meta SET value = %s WHERE key = 'page_cursor_key'",
                             [wrap(new, SECRET_REF, cursor_key).hex()])
            conn.execute("UPDATE store_identity SET master_key_fingerprint = %s", [fingerprint(new_key)])
        return len(rows)
    finally:
        conn.close()
