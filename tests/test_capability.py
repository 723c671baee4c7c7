"""Signed user capabilities: what verifies, what is refused, and what a bucket reveals."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionmem_core.capability import main, mint_capability, new_key, user_bucket, verify_capability
from sessionmem_core.errors import Forbidden, Unauthenticated
from sessionmem_core.keys import Owner, per_user_key

AGENT = Owner("team-a", "support-agent")
OTHER = Owner("team-a", "billing-agent")


def test_a_minted_capability_verifies_to_its_subject() -> None:
    key = new_key()
    token = mint_capability(key, "alice@example.com", AGENT, 60)
    assert verify_capability(key, token, AGENT) == "alice@example.com"


def test_forged_expired_and_foreign_capabilities_are_refused() -> None:
    key = new_key()
    token = mint_capability(key, "alice", AGENT, 60, now=1000)
    head, payload, signature = token.split(".")
    with pytest.raises(Unauthenticated, match="signature"):
        verify_capability(new_key(), mint_capability(key, "alice", AGENT, 60), AGENT)
    with pytest.raises(Unauthenticated, match="signature"):
        bob = mint_capability(key, "bob", AGENT, 60, now=1000).split(".")[1]
        verify_capability(key, f"{head}.{bob}.{signature}", AGENT, now=1001)
    with pytest.raises(Unauthenticated, match="expired"):
        verify_capability(key, token, AGENT, now=1060)
    with pytest.raises(Forbidden):
        verify_capability(key, token, OTHER, now=1001)
    for malformed in ("", "smc1", "smc1.a", "x.y.z", f"smc2.{payload}.{signature}"):
        with pytest.raises(Unauthenticated):
            verify_capability(key, malformed, AGENT, now=1001)


def test_buckets_are_opaque_stable_and_distinct() -> None:
    key = new_key()
    alice, bob = user_bucket(key, AGENT, "alice"), user_bucket(key, AGENT, "bob")
    assert alice == user_bucket(key, AGENT, "alice") and alice != bob
    assert alice != user_bucket(key, OTHER, "alice"), "the same user gets another bucket with another agent"
    assert "alice" not in per_user_key(AGENT, alice, "c1")


def test_short_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        mint_capability(b"short", "alice", AGENT, 60)


def test_cli_mints_a_verifiable_capability(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = new_key()
    key_file = tmp_path / "key"
    key_file.write_bytes(key)
    assert main(["--key-file", str(key_file), "--subject", "carol", "--agent", "team-a/support-agent"]) == 0
    assert verify_capability(key, capsys.readouterr().out.strip(), AGENT) == "carol"
