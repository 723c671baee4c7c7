"""Signed run capabilities: how an end user's identity reaches the proxy without the agent being able
to forge it.

The caller's side (the BFF that authenticated the user) mints ``smc1.<payload>.<signature>`` with a key
it shares with the proxy (a Kubernetes Secret); the payload names the user, the agent it is good for,
and an expiry. The launcher passes it through untouched; the proxy verifies it and derives an opaque
per-user bucket from it, so the user id itself never becomes part of a key.

    python -m sessionmem_core.capability --key-file key --subject alice --agent my-team/support-agent
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import secrets
import sys
import time
from pathlib import Path

import orjson

from sessionmem_core.errors import Forbidden, Unauthenticated
from sessionmem_core.keys import Owner

_VERSION = "smc1"
MAX_SUBJECT_LENGTH = 256
MIN_KEY_BYTES = 32


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: bytes, message: str) -> str:
    return _b64(hmac.new(key, message.encode(), hashlib.sha256).digest())


def _check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a capability key needs at least {MIN_KEY_BYTES} bytes")
    return key


def new_key() -> bytes:
    """A fresh key as text (64 hex characters), so a key file can end in a newline without changing it."""
    return secrets.token_hex(MIN_KEY_BYTES).encode()


def load_key(path: Path) -> bytes:
    """The key in a file (a mounted Secret): surrounding whitespace is not part of it. Checked at start-up,
    so a bad key stops the proxy instead of failing requests."""
    return _check_key(path.read_bytes().strip())


def mint_capability(key: bytes, subject: str, agent: Owner, ttl_seconds: int, now: float | None = None) -> str:
    if not subject or len(subject) > MAX_SUBJECT_LENGTH:
        raise ValueError(f"subject must be 1-{MAX_SUBJECT_LENGTH} characters")
    issued = int(time.time() if now is None else now)
    payload = _b64(orjson.dumps({"sub": subject, "agt": agent.author, "exp": issued + ttl_seconds}))
    head = f"{_VERSION}.{payload}"
    return f"{head}.{_sign(_check_key(key), head)}"


def verify_capability(key: bytes, token: str, agent: Owner, now: float | None = None) -> str:
    """The verified subject. 401 for anything forged, malformed or expired; 403 for a genuine
    capability that was minted for another agent."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != _VERSION:
        raise Unauthenticated("malformed user capability")
    head = f"{parts[0]}.{parts[1]}"
    if not hmac.compare_digest(_sign(_check_key(key), head), parts[2]):
        raise Unauthenticated("user capability signature is invalid")
    try:
        claims = orjson.loads(_unb64(parts[1]))
        subject, audience, expiry = str(claims["sub"]), str(claims["agt"]), int(claims["exp"])
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise Unauthenticated("malformed user capability") from exc
    if expiry <= (time.time() if now is None else now):
        raise Unauthenticated("user capability has expired")
    if audience != agent.author:
        raise Forbidden("user capability was issued for another agent")
    return subject


def user_bucket(key: bytes, agent: Owner, subject: str) -> str:
    """An opaque, stable bucket for (agent, user): 32 hex characters that reveal neither."""
    digest = hmac.new(_check_key(key), f"bucket\0{agent.author}\0{subject}".encode(), hashlib.sha256)
    return digest.hexdigest()[:32]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Mint a sessionmem user capability")
    parser.add_argument("--key-file", type=Path, help="file with the shared capability key")
    parser.add_argument("--new-key", action="store_true", help="print a fresh key for a Secret and exit")
    parser.add_argument("--subject", help="the end user's verified id")
    parser.add_argument("--agent", help="namespace/agent the capability is good for")
    parser.add_argument("--ttl", type=int, default=3600, help="seconds until it expires (default 3600)")
    args = parser.parse_args(argv)
    if args.new_key:
        print(new_key().decode())
        return 0
    if args.key_file is None or args.subject is None or args.agent is None:
        parser.error("--key-file, --subject and --agent are required to mint")
    namespace, _, name = args.agent.partition("/")
    print(mint_capability(load_key(args.key_file), args.subject, Owner(namespace, name), args.ttl))
    return 0


if __name__ == "__main__":
    sys.exit(main())
