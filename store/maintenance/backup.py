"""Online backup and restore of a whole store, as one tar file with a signed manifest.

What a backup holds: a consistent copy of ``engram.duckdb`` (DuckDB's ``COPY FROM DATABASE``,
one transaction), the projections (Tantivy and vector files, so a restored store ranks
byte-identically without a rebuild; sealed with the backup key, as they hold plain text and
embeddings), every data key and the page-cursor secret, and
``manifest.json``: format, store id, created_at, journal heads per scope, and each file's
SHA-256. ``manifest.mac`` is an HMAC-SHA256 of the manifest under the backup key, so a damaged
or edited backup (or a key that is not its own) is refused before anything is written.

How keys are protected: the store's master key never leaves the data dir. Each backup gets a
fresh random *backup key*; every data key is re-wrapped under it (and the cursor secret sealed
with it, and the projection files sealed with it). The backup key is written beside the backup
(``FILE.key``, 0600), never inside it: the tar alone holds only ciphertext and metadata (ids,
digests, cursors, times, the journal). A restore unwraps with the backup key and re-wraps
under a new master key of its own.

Crypto-shredding and backups: a key destroyed before a backup is simply not in it (a forgotten
record's body in the copied DuckDB file is NULL, and free blocks are not copied). A backup taken
*before* a forget still holds that record's key: restoring it over the same store is refused
(RESTORE_REFUSED) when the store's journal has forgotten anything since the backup's heads; to
make a forget reach older backups too, destroy their ``.key`` files (32 bytes each).

Consistency while a server runs: DuckDB lets one process open the file (a second process cannot
even attach it read-only), so the owning process makes the copy, under its engine's write lock
(no lifecycle write or projection update in between; reads wait a moment), and streams the tar
over its owner-only socket (server/admin/socket_routes.py). With no server, the command opens the store
itself and does the same.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import secrets
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.settings import DUCKDB_STORE_FILE
from engram_memory.retrieval._files import sha256_file
from engram_memory.store.backend import StoreBusyError, StoreError
from engram_memory.store.core.crypto import (
    KEYS_DIR,
    _write_private,
    fan_out,
    key_files,
    open_sealed,
    seal,
    shred,
    unwrap,
    wrap,
)
from engram_memory.store.core.refusals import BACKUP_INVALID, RESTORE_REFUSED, AdminRefusal
from engram_memory.store.core.timeutil import to_instant, wall_clock
from engram_memory.store.opening import embedded, shared

FORMAT = "engram-memory-backup/1"
STORE_FILE = DUCKDB_STORE_FILE
MANIFEST, MANIFEST_MAC = "manifest.json", "manifest.mac"
SERVER_KEY_MEMBER = "server.key.sealed"
LAST_BACKUP = "last-backup.json"  # beside the store: the last backup's time, file and heads
SERVER_KEY_AAD = b"engram-backup:server.key"
KEY_PREFIX = "engram-backup-key-v1:"
# Not copied into a backup: per-process runtime files the owner recreates (its lock, socket,
# local-host signing key), and DuckDB's WAL (the copy is a fresh database, already complete).
RUNTIME = {".lock", "engram.sock", "local-host.private.pem", "local-host.token"}


@dataclass
class BackupReport:
    path: Path
    key_path: Path | None
    manifest: dict[str, Any]
    size: int

    def as_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {"backup": str(self.path), "key": str(self.key_path) if self.key_path else None,
                "store_id": m["store_id"], "created_at": m["created_at"], "files": len(m["files"]),
                "bytes": self.size, "heads": m["heads"]}


@dataclass
class RestoreReport:
    data_dir: Path | str  # a PostgreSQL store: its URL
    manifest: dict[str, Any]
    replaced: bool  # an older copy of the same store was replaced
    kept_aside: Path | None = None  # --force over a store ahead of the backup: where it was moved, whole

    def as_dict(self) -> dict[str, Any]:
        m = self.manifest
        out = {"data_dir": str(self.data_dir), "store_id": m["store_id"], "created_at": m["created_at"],
               "files": len(m["files"]), "heads": m["heads"], "replaced": self.replaced}
        if self.kept_aside is not None:
            out["kept_aside"] = str(self.kept_aside)
        return out


# -- keys --------------------------------------------------------------------------------------


def new_backup_key() -> bytes:
    return secrets.token_bytes(32)


def key_id(backup_key: bytes) -> str:
    """Names the key in the manifest (a one-way digest: it reveals nothing of a random key)."""
    return "sha256:" + hashlib.sha256(b"engram-backup-key-id:" + backup_key).hexdigest()[:32]


def write_key_file(path: Path, backup_key: bytes) -> None:
    _write_private(path, (KEY_PREFIX + backup_key.hex() + "\n").encode("ascii"))


def read_key_file(path: Path) -> bytes:
    """Raises AdminRefusal(BACKUP_INVALID) for a file that is not a backup key."""
    try:
        text = path.read_text(encoding="ascii").strip()
        if not text.startswith(KEY_PREFIX):
            raise ValueError
        key = bytes.fromhex(text.removeprefix(KEY_PREFIX))
        if len(key) != 32:
            raise ValueError
    except (OSError, ValueError):
        raise AdminRefusal(BACKUP_INVALID, f"{path} is not an engram-memory backup key") from None
    return key


def _member_aad(name: str) -> bytes:
    return b"engram-backup:" + name.encode("utf-8")


def _mac(backup_key: bytes, manifest_bytes: bytes) -> str:
    return hmac.new(backup_key, manifest_bytes, hashlib.sha256).hexdigest()


# -- store identity ----------------------------------------------------------------------------


# -- backup ------------------------------------------------------------------------------------


def snapshot(engine: Any, backup_key: bytes, out: Path) -> dict[str, Any]:
    """Write the backup tar of ``engine``'s store to ``out`` (0600); returns its manifest.

    The copy is taken under the engine's write lock: DuckDB, the projections and the key files
    agree with each other (and with the journal heads recorded) at one instant. Only the copies
    happen under it (the re-wrapped keys stay in memory); digests and the tar come after."""
    data_dir = Path(engine.config.data_dir)
    staging = Path(tempfile.mkdtemp(prefix=".backup-", dir=data_dir))
    try:
        with engine._rw.write():  # the engine's own write lock (store/core/rwlock.py): nothing changes meanwhile
            db = engine.db
            sid = db.store_id()
            heads = {scope: {"cursor": str(hw), "event_hash": h} for scope, (hw, h) in db.heads().items()}
            db.copy_to(staging / STORE_FILE)
            for scope in heads:  # the vector files may lag their index (Projections.add_vectors)
                engine.projections.vectors(scope).save()
            shutil.copytree(engine.projections.root, staging / "projections",
                            ignore=shutil.ignore_patterns("*.lock"))
            blobs = {f"keys/{name}": blob for name, blob in engine.keys.export(AESGCM(backup_key)).items()}
            blobs[SERVER_KEY_MEMBER] = seal(backup_key, engine.keys.server_secret, SERVER_KEY_AAD)
        # The projections hold plain text (Tantivy's stored fields and terms) and embeddings: in
        # the backup they are sealed with the backup key, each bound to its name.
        for path in sorted((staging / "projections").rglob("*")):
            if path.is_file():
                name = str(path.relative_to(staging))
                path.write_bytes(seal(backup_key, path.read_bytes(), _member_aad(name)))
        files = {str(p.relative_to(staging)): sha256_file(p) for p in sorted(staging.rglob("*")) if p.is_file()}
        files.update({name: "sha256:" + hashlib.sha256(blob).hexdigest() for name, blob in sorted(blobs.items())})
        manifest = {"format": FORMAT, "store_id": sid, "created_at": to_instant(wall_clock()),
                    "key_id": key_id(backup_key), "heads": heads, "files": files}
        manifest_bytes = canonical_bytes(manifest)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar:
            members = {MANIFEST: manifest_bytes, MANIFEST_MAC: _mac(backup_key, manifest_bytes).encode(), **blobs}
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o600, int(wall_clock() // 1000)
                tar.addfile(info, io.BytesIO(data))
            for name in files:
                if name not in blobs:
                    tar.add(staging / name, arcname=name, recursive=False)
            fh.flush()
            os.fsync(fh.fileno())
        _note_backup(data_dir, out, manifest)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _note_backup(data_dir: Path, out: Path, manifest: dict[str, Any]) -> None:
    """The data dir remembers its last backup (when, where, its key id and journal heads; never a
    key), for the operator console's journal page. A failure to note it fails no backup."""
    note = {"created_at": manifest["created_at"], "path": str(out.absolute()), "key_id": manifest["key_id"],
            "heads": {scope: head["cursor"] for scope, head in manifest["heads"].items()}}
    try:
        _write_private(data_dir / LAST_BACKUP, canonical_bytes(note))
    except OSError:
        pass


def last_backup(data_dir: Path) -> dict[str, Any] | None:
    """The last backup's note (``_note_backup``), or None when this data dir never made one."""
    try:
        return dict(json.loads((data_dir / LAST_BACKUP).read_bytes()))
    except (OSError, ValueError):
        return None


def backup_offline(data_dir: Path, out: Path, backup_key: bytes) -> dict[str, Any]:
    """The backup of a store no process holds: open it (without the embedding model) and snapshot."""
    from engram_memory.models.settings import EngineSettings
    from engram_memory.store.core.engine import Engine

    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        return snapshot(engine, backup_key, out)
    finally:
        engine.close()


# -- reading a backup --------------------------------------------------------------------------


def _invalid(message: str) -> AdminRefusal:
    return AdminRefusal(BACKUP_INVALID, message)


def _safe_name(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def extract_verified(backup: Path, backup_key: bytes, into: Path) -> dict[str, Any]:
    """Check the manifest's MAC, then extract every listed file into ``into`` checking its SHA-256.

    Raises AdminRefusal(BACKUP_INVALID) for anything that does not verify: not a tar, truncated,
    a file missing, extra, or changed, a manifest edited, or a key that is not this backup's."""
    try:
        with tarfile.open(backup, mode="r:") as tar:
            members = {m.name: m for m in tar.getmembers()}
            if MANIFEST not in members or MANIFEST_MAC not in members:
                raise _invalid(f"{backup} is not an engram-memory backup (no manifest)")
            manifest_bytes = _read_member(tar, members[MANIFEST])
            mac = _read_member(tar, members[MANIFEST_MAC]).decode("ascii", "replace")
            try:
                manifest = json.loads(manifest_bytes)
            except ValueError:
                raise _invalid(f"{backup}: the manifest is damaged") from None
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                raise _invalid(f"{backup} is not an engram-memory backup of a known format")
            if manifest.get("key_id") != key_id(backup_key):
                raise _invalid(f"the backup key does not belong to {backup}")
            if not hmac.compare_digest(mac, _mac(backup_key, manifest_bytes)):
                raise _invalid(f"{backup}: the manifest does not match its MAC (damaged or edited)")
            files: dict[str, str] = manifest["files"]
            listed = set(files) | {MANIFEST, MANIFEST_MAC}
            if set(members) != listed or not all(_safe_name(n) for n in files):
                raise _invalid(f"{backup}: its files differ from its manifest")
            for name, digest in files.items():
                member = members[name]
                if not member.isfile():
                    raise _invalid(f"{backup}: {name} is not a regular file")
                target = into / name
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    shutil.copyfileobj(source, fh)
                if sha256_file(target) != digest:
                    raise _invalid(f"{backup}: {name} does not match its digest (damaged)")
            return manifest
    except (tarfile.TarError, EOFError, OSError, KeyError, TypeError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, tarfile.TarError) and not backup.exists():
            raise _invalid(f"no backup file at {backup}") from None
        raise _invalid(f"{backup} is damaged or truncated ({type(exc).__name__})") from None


def read_manifest(backup: Path) -> dict[str, Any]:
    """The manifest of a backup just written (no verification: see extract_verified)."""
    with tarfile.open(backup, mode="r:") as tar:
        return dict(json.loads(_read_member(tar, tar.getmember(MANIFEST))))


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    fh = tar.extractfile(member)
    if fh is None:
        raise _invalid("a manifest member is not a file")
    return fh.read()


# -- restore -----------------------------------------------------------------------------------


def _refuse(message: str) -> AdminRefusal:
    return AdminRefusal(RESTORE_REFUSED, message)


def _dir_lock(data_dir: Path) -> Any:
    """The data dir's advisory lock for the whole restore (a refusal creates no lock file)."""
    return embedded().held(
        data_dir, lambda: _refuse(f"data dir {data_dir} is in use by a running server; stop it first"))


def _check_target(data_dir: Path, manifest: dict[str, Any], staged: Path, force: bool) -> tuple[bool, bool]:
    """Whether the target holds a copy of the same store (replaced) and whether it must be kept
    aside (``force`` over a store ahead of the backup); False, False for nothing. Refuses a
    directory holding anything else, a restore that would resurrect forgets, and (without
    ``force``) one that would roll back journal events the backup does not hold."""
    if not data_dir.exists():
        return False, False
    if not data_dir.is_dir():
        raise _refuse(f"{data_dir} is not a directory")
    present = {p.name for p in data_dir.iterdir()} - RUNTIME
    if not present:
        return False, False
    if STORE_FILE not in present:
        raise _refuse(f"{data_dir} is not empty and holds no engram-memory store; restore into an empty directory")
    try:
        stopped = embedded().stopped(data_dir)
    except StoreBusyError:
        raise _refuse(f"data dir {data_dir} is in use by another process") from None
    except StoreError:
        raise _refuse(f"{data_dir} holds an unreadable store; move it aside to restore there") from None
    if stopped.store_id is None or stopped.store_id != manifest["store_id"]:
        raise _refuse(f"{data_dir} holds another store ({stopped.store_id or 'never backed up'});"
                      f" the backup is of {manifest['store_id']}")
    heads = manifest["heads"]
    forgotten = sum(1 for scope, cursor in stopped.tombstones
                    if scope not in heads or cursor > int(heads[scope]["cursor"]))
    if forgotten:
        raise _refuse(f"the store at {data_dir} forgot {forgotten} record(s) after this backup was taken;"
                      " restoring it would bring them back")
    reached = {scope: hw for scope, (hw, _h) in stopped.heads.items()
               if 0 < hw <= int(heads.get(scope, {}).get("cursor", 0))}
    ahead = ahead_of(stopped.heads, heads, embedded().journal_hashes(staged, reached) if reached else {})
    if ahead and not force:
        raise _refuse(f"the store at {data_dir} is ahead of this backup ({ahead}); restoring would discard"
                      " that; add --force to restore anyway (the replaced store is then kept aside, not destroyed)")
    return True, bool(ahead)


def ahead_of(target: dict[str, tuple[int, str]], backup: dict[str, Any], staged_hashes: dict[str, str]) -> str:
    """How far the target's journal is ahead of (or apart from) the backup's, per scope; "" when
    the backup holds every event of the target (the same heads, or the target is an older copy).

    ``staged_hashes``: the backup's event hash at the target's head cursor (where the backup
    reaches it), so a target that went on from an older point on another path is caught too."""
    from engram_memory.models.context import scope_names

    def name(scope: str) -> str:
        names = scope_names(scope)
        return f"{names[0]}/{names[1]}" if names else scope

    parts = []
    for scope, (hw, event_hash) in sorted(target.items()):
        mine = int(backup[scope]["cursor"]) if scope in backup else 0
        if hw > mine:
            parts.append(f"{name(scope)}: {hw - mine} event(s) newer than the backup, cursor {hw} > {mine}")
        elif hw > 0 and staged_hashes.get(scope) != event_hash:
            parts.append(f"{name(scope)}: its journal differs from the backup's at cursor {hw}")
    return "; ".join(parts)


def _shred_store(path: Path) -> None:
    """Destroy a replaced store's keys (overwrite, unlink), then remove the rest."""
    keys = path / KEYS_DIR
    for file in [path / "master.key", path / "server.key", *key_files(keys), *key_files(keys, temporary=True)]:
        shred(file)
    shutil.rmtree(path, ignore_errors=True)


def restore(backup: Path, backup_key: bytes, data_dir: Path, *, force: bool = False) -> RestoreReport:
    """Restore ``backup`` into ``data_dir`` (absent, empty, or an older copy of the same store;
    with ``force`` also a copy ahead of the backup, which is then renamed aside, never shredded).

    Everything is verified and prepared beside the target first; the target is replaced by one
    rename at the end, so a refusal or a crash before it leaves the target as it was."""
    data_dir = data_dir.absolute()  # its parent exists (the command checks): staging goes beside it
    staging = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.restore-", dir=data_dir.parent))
    try:
        manifest = extract_verified(backup, backup_key, staging)
        wrapper = AESGCM(backup_key)
        master = secrets.token_bytes(32)
        _write_private(staging / "master.key", master)
        live = AESGCM(master)
        try:
            for path in sorted((staging / "keys").glob("*")):
                ref = "local:key-" + path.name
                path.write_bytes(wrap(live, ref, unwrap(wrapper, ref, path.read_bytes())))  # (0600: extracted so)
            sealed = (staging / SERVER_KEY_MEMBER).read_bytes()
            server_key = AESGCM(backup_key).decrypt(sealed[:12], sealed[12:], SERVER_KEY_AAD)
            for path in sorted((staging / "projections").rglob("*")):
                if path.is_file():
                    aad = _member_aad(str(path.relative_to(staging)))
                    path.write_bytes(open_sealed(backup_key, path.read_bytes(), aad))
        except (InvalidTag, ValueError):
            raise _invalid(f"{backup}: a sealed file does not open with the backup key (damaged)") from None
        _write_private(staging / "server.key", server_key)
        (staging / SERVER_KEY_MEMBER).unlink()
        fan_out(staging / KEYS_DIR)  # a backup's keys/ is flat (its member names); the store's is fanned out
        os.chmod(staging, 0o700)
        os.sync()  # everything staged is on disk before the swap (one sync, not one per key file)
        with _dir_lock(data_dir):
            replaced, keep = _check_target(data_dir, manifest, staging, force)
            old = None
            if data_dir.exists():
                stamp = to_instant(wall_clock()).replace(":", "")
                old = data_dir.with_name(f"{data_dir.name}.replaced-{stamp}-{secrets.token_hex(3)}" if keep
                                         else f".{data_dir.name}.replaced-{secrets.token_hex(4)}")
                data_dir.rename(old)
            staging.rename(data_dir)
        if old is not None and not keep:
            _shred_store(old)
        return RestoreReport(data_dir, manifest, replaced, old if keep else None)
    finally:
        if staging.exists():
            _shred_store(staging)


def held_by_another(data_dir: Path) -> bool:
    """Whether a running process holds the data dir (its advisory lock)."""
    from engram_memory.store.maintenance.rebuild import _held_by_another

    return _held_by_another(data_dir)


# -- a PostgreSQL store ------------------------------------------------------------------------
#
# One archive format for both backends: a PostgreSQL store is backed up by copying one read-only
# snapshot of it into a temporary DuckDB store (its backend's ``export_store``) and archiving that
# as above; restored by restoring the archive into a temporary directory and migrating it into an
# empty PostgreSQL store (its backend's ``migrate_store``: store/backend.py ``SharedBackend``).
# Either step's temporary store holds a master key of its own beside the data keys it wraps: it
# lives in a private temporary directory and its keys are shredded when the command ends, whatever
# happened. The archive of a PostgreSQL store carries no projections (each node's caches): a store
# restored from it rebuilds them on first use.


def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="engram-pg-"))  # 0700


def backup_postgres(url: str, master_key: bytes, key_file: Path, out: Path, backup_key: bytes) -> dict[str, Any]:
    """The backup of the live PostgreSQL store at ``url`` written to ``out``; returns its manifest."""
    scratch = _scratch()
    try:
        shared(url).export_store(url, master_key, key_file, scratch / "data")
        return backup_offline(scratch / "data", out, backup_key)
    finally:
        _shred_store(scratch / "data")
        shutil.rmtree(scratch, ignore_errors=True)


def restore_postgres(backup: Path, backup_key: bytes, url: str, master_key: bytes) -> RestoreReport:
    """Restore ``backup`` into the empty PostgreSQL store at ``url``, its keys wrapped under
    ``master_key``. Raises AdminRefusal (BACKUP_INVALID; RESTORE_REFUSED when the store is not empty)."""
    from engram_memory.store.backend import StoreRefused

    scratch = _scratch()
    try:
        report = restore(backup, backup_key, scratch / "data")
        try:
            shared(url).migrate_store(scratch / "data", url, master_key)
        except StoreRefused as exc:
            ahead = _postgres_ahead(url, report.manifest, scratch / "data")
            if ahead:
                raise AdminRefusal(RESTORE_REFUSED, f"the PostgreSQL store is ahead of this backup ({ahead});"
                                   " restoring would discard that; a PostgreSQL store is restored only into an"
                                   " empty database, never over a store (restore into a new database)") from None
            raise AdminRefusal(RESTORE_REFUSED, str(exc).replace("migrate into", "restore into")) from None
        return RestoreReport(url, report.manifest, False)
    finally:
        _shred_store(scratch / "data")
        shutil.rmtree(scratch, ignore_errors=True)


def _postgres_ahead(url: str, manifest: dict[str, Any], staged: Path) -> str:
    """How far the PostgreSQL store at ``url`` is ahead of the backup (``ahead_of``), when it is a
    copy of the same store; "" otherwise (another store, or one that cannot be read)."""
    heads = shared(url).store_heads(url, manifest["store_id"])
    if heads is None:
        return ""
    backup_heads = manifest["heads"]
    reached = {scope: hw for scope, (hw, _h) in heads.items()
               if 0 < hw <= int(backup_heads.get(scope, {}).get("cursor", 0))}
    return ahead_of(heads, backup_heads, embedded().journal_hashes(staged, reached) if reached else {})
