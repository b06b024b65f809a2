"""Envelope encryption with crypto-shredding.

Every pending candidate and every admitted record gets its own random AES-256-GCM data
key. Data keys live in one file each under ``keys/``, wrapped by the master key
(``master.key``, mode 0600). Destroying a key overwrites and unlinks its file, so the
ciphertext left anywhere (DuckDB free blocks included) becomes unreadable. Key files are
outside the DuckDB transaction on purpose: a key is created before the commit that
references it and destroyed after the commit that drops it; ``sweep_orphans`` removes
keys no row references, so a crash in between converges.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE = 12


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class KeyStore:
    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "keys"
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        master_path = data_dir / "master.key"
        if not master_path.exists():
            _write_private(master_path, secrets.token_bytes(32))
        os.chmod(master_path, 0o600)
        self._master = AESGCM(master_path.read_bytes())
        secret_path = data_dir / "server.key"
        if not secret_path.exists():
            _write_private(secret_path, secrets.token_bytes(32))
        os.chmod(secret_path, 0o600)
        self.server_secret = secret_path.read_bytes()  # authenticates page cursors

    def _path(self, key_ref: str) -> Path:
        return self.dir / key_ref.removeprefix("local:key-")

    def create(self) -> tuple[str, bytes]:
        key_ref = "local:key-" + secrets.token_hex(12)
        dek = AESGCM.generate_key(bit_length=256)
        nonce = secrets.token_bytes(NONCE)
        _write_private(self._path(key_ref), nonce + self._master.encrypt(nonce, dek, key_ref.encode()))
        return key_ref, dek

    def load(self, key_ref: str) -> bytes | None:
        try:
            blob = self._path(key_ref).read_bytes()
        except FileNotFoundError:
            return None
        return self._master.decrypt(blob[:NONCE], blob[NONCE:], key_ref.encode())

    def destroy(self, key_ref: str) -> bool:
        """Overwrite then unlink; True once the key is gone (also when it already was)."""
        path = self._path(key_ref)
        try:
            size = path.stat().st_size
            with open(path, "r+b") as fh:
                fh.write(secrets.token_bytes(size))
                fh.flush()
                os.fsync(fh.fileno())
            path.unlink()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return not path.exists()

    def sweep_orphans(self, referenced: set[str]) -> int:
        removed = 0
        for path in self.dir.iterdir():
            ref = "local:key-" + path.name
            if path.name.endswith(".tmp") or ref not in referenced:
                if path.name.endswith(".tmp"):
                    path.unlink(missing_ok=True)
                elif self.destroy(ref):
                    removed += 1
        return removed


def seal(dek: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = secrets.token_bytes(NONCE)
    return nonce + AESGCM(dek).encrypt(nonce, plaintext, aad)


def open_sealed(dek: bytes, blob: bytes, aad: bytes) -> bytes:
    try:
        return AESGCM(dek).decrypt(blob[:NONCE], blob[NONCE:], aad)
    except InvalidTag as exc:
        raise ValueError("sealed blob failed authentication") from exc
