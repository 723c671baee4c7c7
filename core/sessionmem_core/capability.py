"""Signed run capabilities: how an end user's identity reaches the proxy without the agent being able
to forge it.

The caller's side (the BFF that authenticated the user) mints ``smc2.<payload>.<signature>`` with a
signing key it shares with the proxy (a Kubernetes Secret). The payload names the key that signed it
(``kid``), the user (``sub``), the agent it is good for (``agt``), when it was issued (``iat``) and when it
expires (``exp``). The proxy holds a keyring of signing keys, so a new key can be rolled out while the
old one still verifies (overlap), and it refuses any capability whose lifetime exceeds its own maximum,
whatever the minting side asked for: a leaked capability is good for minutes, not hours.

Buckets are derived from a separate bucket key that only the proxy holds and that is never rotated with
the signing keys: rotating a signing key moves no user to a new bucket. A deployment that predates the
bucket key keeps deriving buckets from its single legacy key (``Keyring.load``), so none is orphaned.

    python -m sessionmem_core.capability --new-key
    python -m sessionmem_core.capability --key-file key --kid 2026-12 --subject alice --agent my-team/support-agent
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import secrets
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from sessionmem_core.env import DEFAULT_CAPABILITY_MAX_LIFETIME_SECONDS
from sessionmem_core.errors import Forbidden, Unauthenticated
from sessionmem_core.keys import Owner

_VERSION = "smc2"
MAX_SUBJECT_LENGTH = 256
MAX_KID_LENGTH = 64
MIN_KEY_BYTES = 32
# The clock skew the proxy tolerates on iat.
CLOCK_SKEW_SECONDS = 60
# Longest header value worth looking at: a valid capability is a few hundred characters.
MAX_CAPABILITY_LENGTH = 4096
LEGACY_KID = "default"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a capability key needs at least {MIN_KEY_BYTES} bytes")
    return key


def check_kid(kid: str) -> str:
    """A key id as keyrings name their keys (this one's, and the proxy's data key keyring)."""
    if not kid or len(kid) > MAX_KID_LENGTH or not kid.isascii() or not all(c.isalnum() or c in "-_." for c in kid):
        raise ValueError(f"a key id is 1-{MAX_KID_LENGTH} characters of [A-Za-z0-9._-]")
    return kid


def key_files(path: Path) -> dict[str, Path]:
    """The keys of a keyring by key id: a folder (a mounted Secret: each file is a key named by its id;
    Kubernetes' ``..data`` entries are skipped) or one file (id ``default``)."""
    if path.is_dir():
        return {e.name: e for e in sorted(path.iterdir()) if not e.name.startswith(".") and e.is_file()}
    return {LEGACY_KID: path}


def new_key() -> bytes:
    """A fresh key as text (64 hex characters), so a key file can end in a newline without changing it."""
    return secrets.token_hex(MIN_KEY_BYTES).encode()


def load_key(path: Path) -> bytes:
    """The key in a file (a mounted Secret): surrounding whitespace is not part of it. Checked at start-up,
    so a bad key stops the proxy instead of failing requests."""
    return _check_key(path.read_bytes().strip())


@dataclass(frozen=True)
class Keyring:
    """What the proxy verifies capabilities with and derives buckets from."""

    signing_keys: Mapping[str, bytes]
    bucket_key: bytes
    max_lifetime_seconds: int = DEFAULT_CAPABILITY_MAX_LIFETIME_SECONDS

    def __post_init__(self) -> None:
        if not self.signing_keys:
            raise ValueError("a keyring needs at least one signing key")
        for kid, key in self.signing_keys.items():
            check_kid(kid)
            _check_key(key)
        _check_key(self.bucket_key)
        if self.max_lifetime_seconds < 1:
            raise ValueError("the maximum capability lifetime must be at least 1 second")

    @classmethod
    def single(
        cls, key: bytes, kid: str = LEGACY_KID, max_lifetime_seconds: int = DEFAULT_CAPABILITY_MAX_LIFETIME_SECONDS
    ) -> Keyring:
        """One signing key that also derives the buckets (a deployment without a separate bucket key)."""
        return cls({kid: key}, key, max_lifetime_seconds)

    @classmethod
    def load(
        cls,
        signing: Path,
        bucket_key_file: Path | None = None,
        max_lifetime_seconds: int = DEFAULT_CAPABILITY_MAX_LIFETIME_SECONDS,
    ) -> Keyring:
        """Signing keys from ``signing``: a file (one key, id ``default``) or a folder (a mounted Secret:
        each file is a key named by its key id; Kubernetes' ``..data`` entries are skipped). Buckets come
        from ``bucket_key_file``; without one, a single signing key derives them (how deployments before
        key rotation did), and several keys without a bucket key are refused: rotating would orphan them."""
        keys = {kid: load_key(file) for kid, file in key_files(signing).items()}
        if bucket_key_file is not None:
            bucket = load_key(bucket_key_file)
        elif len(keys) == 1:
            bucket = next(iter(keys.values()))
        else:
            raise ValueError("several signing keys need a bucket key file: buckets must not follow a signing key")
        return cls(keys, bucket, max_lifetime_seconds)


def mint_capability(
    key: bytes,
    subject: str,
    agent: Owner,
    ttl_seconds: int,
    now: float | None = None,
    kid: str = LEGACY_KID,
) -> str:
    if not subject or len(subject) > MAX_SUBJECT_LENGTH:
        raise ValueError(f"subject must be 1-{MAX_SUBJECT_LENGTH} characters")
    issued = int(time.time() if now is None else now)
    claims = {"kid": check_kid(kid), "sub": subject, "agt": agent.author, "iat": issued, "exp": issued + ttl_seconds}
    head = f"{_VERSION}.{_b64(orjson.dumps(claims))}"
    return f"{head}.{_b64(_signature(_check_key(key), head.encode()))}"


def _claims(token: str) -> tuple[bytes, dict[str, object], bytes]:
    """(signed bytes, claims, signature) of a well-formed token; 401 for anything else."""
    if len(token) > MAX_CAPABILITY_LENGTH or not token.isascii():
        raise Unauthenticated("malformed user capability")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != _VERSION:
        raise Unauthenticated("malformed user capability")
    try:
        claims = orjson.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except (ValueError, binascii.Error, orjson.JSONDecodeError) as exc:
        raise Unauthenticated("malformed user capability") from exc
    if not isinstance(claims, dict):
        raise Unauthenticated("malformed user capability")
    return f"{parts[0]}.{parts[1]}".encode(), claims, signature


def verify_capability(keyring: Keyring, token: str, agent: Owner, now: float | None = None) -> str:
    """The verified subject. 401 for anything forged, malformed, signed by an unknown key, expired, issued
    in the future or living longer than the keyring allows; 403 for a genuine capability that was minted
    for another agent."""
    signed, claims, signature = _claims(token)
    kid = claims.get("kid")
    key = keyring.signing_keys.get(kid) if isinstance(kid, str) else None
    if key is None:
        raise Unauthenticated("user capability is signed by an unknown key")
    if not hmac.compare_digest(_signature(key, signed), signature):
        raise Unauthenticated("user capability signature is invalid")
    subject, audience, issued, expiry = (claims.get(k) for k in ("sub", "agt", "iat", "exp"))
    if not (
        isinstance(subject, str)
        and 0 < len(subject) <= MAX_SUBJECT_LENGTH
        and isinstance(audience, str)
        and type(issued) is int
        and type(expiry) is int
    ):
        raise Unauthenticated("malformed user capability")
    current = time.time() if now is None else now
    if expiry <= current:
        raise Unauthenticated("user capability has expired")
    if issued > current + CLOCK_SKEW_SECONDS:
        raise Unauthenticated("user capability is issued in the future")
    if expiry - issued > keyring.max_lifetime_seconds:
        raise Unauthenticated(f"user capability lives longer than this proxy allows ({keyring.max_lifetime_seconds}s)")
    if audience != agent.author:
        raise Forbidden("user capability was issued for another agent")
    return subject


def user_bucket(keyring: Keyring, agent: Owner, subject: str) -> str:
    """An opaque, stable bucket for (agent, user): 32 hex characters that reveal neither, derived from the
    bucket key alone, so it survives the rotation of signing keys."""
    digest = hmac.new(keyring.bucket_key, f"bucket\0{agent.author}\0{subject}".encode(), hashlib.sha256)
    return digest.hexdigest()[:32]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Mint a sessionmem user capability")
    parser.add_argument("--key-file", type=Path, help="file with the shared signing key")
    parser.add_argument("--kid", default=LEGACY_KID, help=f"the signing key's id in the proxy's keyring ({LEGACY_KID})")
    parser.add_argument("--new-key", action="store_true", help="print a fresh key for a Secret and exit")
    parser.add_argument("--subject", help="the end user's verified id")
    parser.add_argument("--agent", help="namespace/agent the capability is good for")
    parser.add_argument(
        "--ttl",
        type=int,
        default=DEFAULT_CAPABILITY_MAX_LIFETIME_SECONDS,
        help="seconds until it expires (default %(default)s; the proxy refuses longer ones)",
    )
    args = parser.parse_args(argv)
    if args.new_key:
        print(new_key().decode())
        return 0
    if args.key_file is None or args.subject is None or args.agent is None:
        parser.error("--key-file, --subject and --agent are required to mint")
    namespace, _, name = args.agent.partition("/")
    print(mint_capability(load_key(args.key_file), args.subject, Owner(namespace, name), args.ttl, kid=args.kid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
