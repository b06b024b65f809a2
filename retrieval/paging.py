"""Opaque, tamper-proof page cursors (HMAC-SHA256 with the data directory's server key).

A cursor pins the ranking it came from: the paging-free request digest, the profile, the
read instant, the scope's journal cursor and the digest of the ordered ids. Anything that
does not verify, or no longer matches, is STALE_PAGE.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.errors import EngramError


@dataclass(frozen=True)
class PagePin:
    request_digest: str
    profile: str
    valid_as_of: int
    system_as_of: str
    offset: int
    ordered_ids_digest: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, scope_ref: str, body: bytes) -> bytes:
    return hmac.new(secret, scope_ref.encode("utf-8") + b"\0" + body, hashlib.sha256).digest()


def encode(secret: bytes, scope_ref: str, pin: PagePin) -> str:
    body = canonical_bytes(
        {
            "r": pin.request_digest.removeprefix("sha256:"),
            "p": pin.profile,
            "v": pin.valid_as_of,
            "s": pin.system_as_of,
            "o": pin.offset,
            "d": pin.ordered_ids_digest.removeprefix("sha256:"),
        }
    )
    return _b64(body) + "." + _b64(_mac(secret, scope_ref, body))


def decode(secret: bytes, scope_ref: str, cursor: str) -> PagePin:
    try:
        body_text, mac_text = cursor.split(".")
        body = _unb64(body_text)
        if not hmac.compare_digest(_unb64(mac_text), _mac(secret, scope_ref, body)):
            raise ValueError("bad mac")
        data = json.loads(body)
        return PagePin(
            request_digest="sha256:" + data["r"],
            profile=data["p"],
            valid_as_of=int(data["v"]),
            system_as_of=str(data["s"]),
            offset=int(data["o"]),
            ordered_ids_digest="sha256:" + data["d"],
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise EngramError("STALE_PAGE", "page cursor does not verify") from exc
