"""The instance's signing key and the anchors of run chains' heads (issue 33, items 7 and 10).

A chain of hashes proves that no event was changed or removed *inside* it, not that its end is
where it was: whoever may rewrite the table can cut the last events and move the head back, or
recompute every link (plain sha256, no key). So each run chain's head is anchored twice:

- **signed** with the instance's Ed25519 key (a public-key signature rather than an HMAC: a bundle
  carries the signer's public key, and another instance verifies it without holding a secret
  that would let it forge one);
- **written outside the database**, one JSON line per anchor appended to
  ``DATA_DIR/chain-anchors/<run uuid>.jsonl``. The database superuser can rewrite every table
  (and drop the triggers that make events append-only) but not the application's files, nor sign
  a head without the key file; an anchor kept in a table would be deleted with the tail it
  guards.

:func:`chain_verify <apps.experiments.events.chain_verify>` checks the chain against every
anchor: each must carry a valid signature of this instance, and the chain must still hold the
anchored event (same seq, same hash). A cut tail loses an anchored event; a re-hashed chain no
longer has the anchored hash. Anchors are written by every verification that passes (a new
head only), by export, and when a run finishes; events after the newest anchor are protected by
the chain alone until the next one.

The key lives in ``settings.INSTANCE_KEY_FILE`` (default ``DATA_DIR/instance-ed25519.pem``),
created on first use with mode 0600. The global chain is not anchored (it outlives any one run).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings

__all__ = [
    "anchor_head",
    "anchors_check",
    "head_payload",
    "instance_fingerprint",
    "instance_public_key",
    "sign",
    "signature_valid",
]

GLOBAL_CHAIN = "global"
logger = logging.getLogger(__name__)


def _key_path() -> Path:
    return Path(getattr(settings, "INSTANCE_KEY_FILE", "") or Path(settings.DATA_DIR) / "instance-ed25519.pem")


@cache
def _private_key(path: Path) -> Ed25519PrivateKey:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "wb") as out:
                out.write(pem)
    loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ValueError(f"{path} holds no Ed25519 private key")
    return loaded


def instance_public_key() -> str:
    """This instance's public key, 32 bytes as hex."""
    raw = (
        _private_key(_key_path()).public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return raw.hex()


def instance_fingerprint(public_key: str | None = None) -> str:
    """A public key's short name (the first 16 hex digits of its sha256); this instance's by default."""
    return hashlib.sha256(bytes.fromhex(public_key or instance_public_key())).hexdigest()[:16]


def sign(payload: bytes) -> str:
    return _private_key(_key_path()).sign(payload).hex()


def signature_valid(public_key: str, payload: bytes, signature: str) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(bytes.fromhex(signature), payload)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def head_payload(key: str, seq: int, head_hash: str) -> bytes:
    return f"rsiweb.chain-head:{key}:{seq}:{head_hash}".encode()


def _anchor_file(key: str) -> Path:
    return Path(settings.DATA_DIR) / "chain-anchors" / f"{key}.jsonl"


def anchors_of(key: str) -> list[dict[str, Any]]:
    """Every anchor written for one chain, oldest first (a torn last line is skipped)."""
    path = _anchor_file(key)
    if key == GLOBAL_CHAIN or not path.exists():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            anchor = json.loads(line)
        except ValueError:
            continue
        if isinstance(anchor, dict):
            found.append(anchor)
    return found


def anchor_head(key: str, seq: int, head_hash: str) -> dict[str, Any] | None:
    """Sign the head and append it to the chain's anchor file, unless that head is anchored already.

    A process that cannot write the data folder (or read the key) logs it and anchors nothing:
    the chain still verifies as before, with the weaker guarantee, rather than the caller failing.
    """
    if key == GLOBAL_CHAIN or seq <= 0:
        return None
    try:
        return _anchor_head(key, seq, head_hash)
    except (OSError, ValueError) as error:
        logger.warning("chain %s: head %s not anchored (%s)", key, seq, error)
        return None


def _anchor_head(key: str, seq: int, head_hash: str) -> dict[str, Any]:
    known = anchors_of(key)
    if known and known[-1].get("seq") == seq and known[-1].get("hash") == head_hash:
        return known[-1]
    anchor = {"seq": seq, "hash": head_hash, "signature": sign(head_payload(key, seq, head_hash))}
    path = _anchor_file(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write of one line with O_APPEND: concurrent writers never interleave inside a line.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        os.write(fd, (json.dumps(anchor, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)
    return anchor


def anchors_check(key: str, hashes: dict[int, str], head_seq: int) -> tuple[int, str] | None:
    """(seq, reason) of the first anchor the chain no longer holds, or None.

    ``hashes``: seq -> hash of the chain's events as they are now; ``head_seq``: its head.
    """
    anchors = anchors_of(key)
    public = instance_public_key() if anchors else ""
    for anchor in anchors:
        seq, head_hash = anchor.get("seq"), anchor.get("hash")
        if not isinstance(seq, int) or not isinstance(head_hash, str):
            return 0, "an anchor line is malformed"
        if not signature_valid(public, head_payload(key, seq, head_hash), str(anchor.get("signature", ""))):
            return seq, f"the anchor of seq {seq} is not signed by this instance's key"
        if seq > head_seq:
            return head_seq + 1, f"the tail was cut: seq {seq} was anchored, the chain now ends at {head_seq}"
        if hashes.get(seq) != head_hash:
            return seq, f"event {seq} is not the anchored one (the chain was re-hashed or rewritten)"
    return None
