"""Envelope encryption with crypto-shredding.

Every pending candidate and every admitted record gets its own random AES-256-GCM data
key. Data keys live in one file each under ``keys/``, fanned out by the first two hex digits of
the SHA-256 of the key's name (``keys/3f/<name>``: 256 directories, so 50,000 keys are ~200 a
directory; ``key_file`` is the one place that knows it), wrapped by the master key
(``master.key``, mode 0600). Destroying a key overwrites and unlinks its file, so the
ciphertext left anywhere (DuckDB free blocks included) becomes unreadable. Key files are
outside the DuckDB transaction on purpose: a key is created before the commit that
references it and destroyed after the commit that drops it; ``sweep_orphans`` removes
keys no row references, so a crash in between converges.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import secrets
import shutil
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.retrieval._files import fsync_dir

NONCE = 12
ROTATION_DIR = "rotate"  # a master-key rotation in progress (see KeyStore.rotate)
COMMITTED = "COMMITTED"


def wrap(master: AESGCM, key_ref: str, dek: bytes) -> bytes:
    """A data key's file content: sealed under ``master``, bound to its key_ref."""
    nonce = secrets.token_bytes(NONCE)
    return nonce + master.encrypt(nonce, dek, key_ref.encode())


def unwrap(master: AESGCM, key_ref: str, blob: bytes) -> bytes:
    """Raises cryptography's InvalidTag when ``master`` is not the key that wrapped ``blob``."""
    return master.decrypt(blob[:NONCE], blob[NONCE:], key_ref.encode())


def shred(path: Path) -> None:
    """Overwrite a key file in place, then unlink it (absent is fine)."""
    try:
        size = path.stat().st_size
        with open(path, "r+b") as fh:
            fh.write(secrets.token_bytes(size))
            fh.flush()
            os.fsync(fh.fileno())
        path.unlink()
    except FileNotFoundError:
        pass


def _overwrite_in_place(path: Path, data: bytes) -> None:
    """Replace a file's bytes in its own blocks (the old bytes are overwritten, not unlinked)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, data, 0)  # written over the old bytes first (a master key is always 32 bytes)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def write_owner_only(path: Path, data: bytes, *, exclusive: bool) -> None:
    """``data`` (a key: a few bytes) in a file only its owner reads, on disk before this returns;
    ``exclusive``: FileExistsError rather than replace a file already there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC), 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write_owner_only(tmp, data, exclusive=False)
    os.replace(tmp, path)


KEYS_DIR = "keys"
KEY_PREFIX = "local:key-"
TMP_SUFFIX = ".tmp"


def key_name(key_ref: str) -> str:
    """A data key's file name: its key_ref without the ``local:key-`` prefix."""
    return key_ref.removeprefix(KEY_PREFIX)


def key_shard(name: str) -> str:
    """The directory under ``keys/`` a data key's file (by bare name) goes in: the first two hex
    digits of the SHA-256 of its name."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:2]


def key_file(keys_dir: Path, key_ref: str) -> Path:
    """Where a data key's file lives (``key_ref`` or its bare name): ``keys/<key_shard>/<name>``."""
    name = key_name(key_ref)
    return keys_dir / key_shard(name) / name


def find_key_file(keys_dir: Path, key_ref: str) -> Path | None:
    """The data key's file where it is: fanned out, or still in a store's flat ``keys/`` from
    before the fan-out (a store not opened since); None when it is in neither."""
    for path in (key_file(keys_dir, key_ref), keys_dir / key_name(key_ref)):
        if path.is_file():
            return path
    return None


def key_files(keys_dir: Path, *, temporary: bool = False) -> list[Path]:
    """Every data key file under ``keys_dir``, in both layouts, sorted by name (``temporary``: the
    ``.tmp`` files a crash left mid-write instead)."""
    return [Path(e.path) for e in _key_entries(keys_dir) if e.name.endswith(TMP_SUFFIX) == temporary]


def _key_entries(keys_dir: Path) -> list[os.DirEntry[str]]:
    """The regular files under ``keys_dir`` and its fan-out directories, sorted by name. Through
    scandir, whose entries know their type without a stat each: at every open (the orphan sweep)
    pathlib's iterdir and is_file took 0.7 s a pass over 40,000 keys."""
    found: list[os.DirEntry[str]] = []
    try:
        top = list(os.scandir(keys_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in top:
        if entry.is_dir():
            with os.scandir(entry.path) as inner:
                found.extend(e for e in inner if e.is_file())
        elif entry.is_file():
            found.append(entry)
    return sorted(found, key=lambda e: e.name)


def fan_out(keys_dir: Path) -> int:
    """Move the key files of the flat layout (``keys/<name>``) into the fan-out, each by one
    rename (atomic: a key is always in exactly one of the two places), then make the moves durable.
    A flat file whose fanned-out place is taken is a stale copy (a rotation finished over the
    fanned-out file: the flat one is wrapped under the destroyed master key) and is shredded.
    Idempotent; returns how many keys moved."""
    flat = [p for p in keys_dir.iterdir() if p.is_file()] if keys_dir.is_dir() else []
    touched: set[Path] = set()
    moved = 0
    for path in flat:
        if path.name.endswith(TMP_SUFFIX):
            path.unlink(missing_ok=True)  # a write a crash cut short: never named by a commit
            continue
        target = key_file(keys_dir, path.name)
        target.parent.mkdir(mode=0o700, exist_ok=True)
        if target.exists():
            shred(path)
            continue
        os.rename(path, target)
        touched.add(target.parent)
        moved += 1
    for directory in sorted(touched):
        fsync_dir(directory)
    if flat:
        fsync_dir(keys_dir)
    return moved


class KeyStore:
    def __init__(self, data_dir: Path, *, migrate: bool = True) -> None:
        """``migrate`` (not for a read-only look, admin verify): a flat ``keys/`` from before the
        fan-out is fanned out now."""
        self.dir = data_dir / KEYS_DIR
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if migrate:
            fan_out(self.dir)
        finish_rotation(data_dir)  # a rotation a crash interrupted: completed or undone first
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
        """Where the key is (either layout), or where a new one goes."""
        return find_key_file(self.dir, key_ref) or key_file(self.dir, key_ref)

    def _new_path(self, key_ref: str, synced_later: bool = False) -> Path:
        path = key_file(self.dir, key_ref)
        if not path.parent.is_dir():
            path.parent.mkdir(mode=0o700, exist_ok=True)
            if not synced_later:  # (create_many syncs the keys' directory itself: see there)
                fsync_dir(self.dir)  # the new directory's entry durable before a key in it is named
        return path

    def create(self) -> tuple[str, bytes]:
        key_ref = KEY_PREFIX + secrets.token_hex(12)
        dek = AESGCM.generate_key(bit_length=256)
        nonce = secrets.token_bytes(NONCE)
        _write_private(self._new_path(key_ref), nonce + self._master.encrypt(nonce, dek, key_ref.encode()))
        return key_ref, dek

    def create_many(self, count: int) -> list[tuple[str, bytes]]:
        """``count`` new keys written together: no fsync per file, then one sync of the file system
        (without syncfs: a whole sync, then an fsync of each directory written to), before the
        caller's commit names any of them (a crash before that leaves keys no row references: swept
        at the next open)."""
        # Plain strings, not Path objects: pathlib's joins and hashes were a third of the time this
        # loop held the GIL (py-spy --gil of a 5,000-item import).
        made, dirs, base = [], set(), os.fspath(self.dir)
        for _ in range(count):
            key_ref = KEY_PREFIX + secrets.token_hex(12)
            dek = AESGCM.generate_key(bit_length=256)
            name = key_name(key_ref)
            directory = os.path.join(base, key_shard(name))
            if directory not in dirs:
                os.makedirs(directory, mode=0o700, exist_ok=True)  # synced below with the keys
                dirs.add(directory)
            fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, wrap(self._master, key_ref, dek))
            finally:
                os.close(fd)
            made.append((key_ref, dek))
        # syncfs writes back every dirty inode of the file system, the directories' new entries
        # included, and commits its journal before it returns: an fsync of each directory after it
        # (up to 256 a batch, ~1 ms each) adds nothing. Without syncfs, each directory is fsynced.
        if made and not sync_file_system(self.dir):
            for synced in sorted({Path(d) for d in dirs} | {self.dir}):
                fsync_dir(synced)
        return made

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
            shred(path)
        except OSError:
            return False
        return not path.exists()

    def key_refs(self) -> list[str]:
        """Every data key on disk, sorted."""
        return [KEY_PREFIX + e.name for e in _key_entries(self.dir) if not e.name.endswith(TMP_SUFFIX)]

    def export(self, wrapper: AESGCM) -> dict[str, bytes]:
        """Every data key re-wrapped under ``wrapper`` (a backup's own key): file name -> content
        (the bare name: a backup's ``keys/`` and a rotation's staging are flat)."""
        out = {}
        for ref in self.key_refs():
            dek = self.load(ref)
            if dek is not None:
                out[key_name(ref)] = wrap(wrapper, ref, dek)
        return out

    def rotate(self, data_dir: Path) -> int:
        """Re-wrap every data key under a fresh master key; the old master key is then destroyed.

        Crash-safe in two phases. (1) :meth:`stage_rotation`: the new master and every
        re-wrapped key are written under ``rotate/``, the live files untouched, so a crash
        leaves the old store as it was (the next open discards the staging). (2) Once
        ``rotate/COMMITTED`` is written, :func:`finish_rotation` moves the re-wrapped keys over
        the live ones and writes the new master over ``master.key`` in place; a crash in this
        phase is rolled forward by the next open, which needs only the staged files. The
        caller holds the data dir's lock. Returns the number of keys re-wrapped."""
        count = self.stage_rotation(data_dir)
        finish_rotation(data_dir)
        self._master = AESGCM((data_dir / "master.key").read_bytes())
        return count

    def stage_rotation(self, data_dir: Path) -> int:
        """Phase 1 of :meth:`rotate`: stage and commit the re-wrapped keys (live files untouched)."""
        stage = data_dir / ROTATION_DIR
        if stage.exists():
            finish_rotation(data_dir)
        (stage / "keys").mkdir(mode=0o700, parents=True)
        new_master = secrets.token_bytes(32)
        _write_private(stage / "master.key", new_master)
        staged = self.export(AESGCM(new_master))
        for name, blob in staged.items():
            fd = os.open(stage / "keys" / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, blob)
            finally:
                os.close(fd)
        os.sync()  # every staged key on disk before the commit marker (one sync, not one per key)
        _write_private(stage / COMMITTED, b"1")
        fsync_dir(stage)
        return len(staged)

    def sweep_orphans(self, referenced: set[str]) -> int:
        removed = 0
        for entry in _key_entries(self.dir):  # one pass for both kinds
            if entry.name.endswith(TMP_SUFFIX):
                Path(entry.path).unlink(missing_ok=True)
            elif KEY_PREFIX + entry.name not in referenced and self.destroy(KEY_PREFIX + entry.name):
                removed += 1
        return removed


def finish_rotation(data_dir: Path) -> None:
    """Complete a committed master-key rotation, or discard an uncommitted one (idempotent: a
    crash at any step of this function is finished by the next call)."""
    stage = data_dir / ROTATION_DIR
    if not stage.exists():
        return
    staged_master, staged_keys, marker = stage / "master.key", stage / "keys", stage / COMMITTED
    if marker.exists():
        keys = data_dir / KEYS_DIR
        touched = {keys}
        for path in sorted(staged_keys.iterdir()) if staged_keys.exists() else ():
            target = key_file(keys, path.name)
            target.parent.mkdir(mode=0o700, exist_ok=True)
            os.replace(path, target)  # each key file: old wrap or new wrap, never torn
            (keys / path.name).unlink(missing_ok=True)  # a flat copy under the old master (a store not fanned out)
            touched.add(target.parent)
        for directory in sorted(touched):
            fsync_dir(directory)
        if staged_master.exists():
            # The old master's bytes are overwritten where they lie, then the staged copy goes.
            _overwrite_in_place(data_dir / "master.key", staged_master.read_bytes())
            shred(staged_master)
    else:
        shred(staged_master)  # never used: nothing was wrapped under it outside the staging
        for path in staged_keys.glob("*") if staged_keys.exists() else ():
            shred(path)
    shutil.rmtree(staged_keys, ignore_errors=True)
    marker.unlink(missing_ok=True)  # last: without it, only empty leftovers can remain
    shutil.rmtree(stage)
    fsync_dir(data_dir)


def sync_file_system(path: Path) -> bool:
    """Flush every file of the file system holding ``path`` (Linux syncfs: one call for a batch of
    key files, where an fsync each costs milliseconds); elsewhere a whole sync. True when syncfs did
    it (its metadata, directory entries included, is then durable too)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        os.sync()
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            os.sync()
            return False
        return True
    finally:
        os.close(fd)


def seal(dek: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = secrets.token_bytes(NONCE)
    return nonce + AESGCM(dek).encrypt(nonce, plaintext, aad)


def open_sealed(dek: bytes, blob: bytes, aad: bytes) -> bytes:
    try:
        return AESGCM(dek).decrypt(blob[:NONCE], blob[NONCE:], aad)
    except InvalidTag as exc:
        raise ValueError("sealed blob failed authentication") from exc
