"""Signed user capabilities: what verifies, what is refused, what a bucket reveals, and key rotation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionmem_core.capability import Keyring, main, mint_capability, new_key, user_bucket, verify_capability
from sessionmem_core.errors import Forbidden, Unauthenticated
from sessionmem_core.keys import Owner, per_user_key

AGENT = Owner("team-a", "support-agent")
OTHER = Owner("team-a", "billing-agent")


def test_a_minted_capability_verifies_to_its_subject() -> None:
    key = new_key()
    token = mint_capability(key, "alice@example.com", AGENT, 60)
    assert verify_capability(Keyring.single(key), token, AGENT) == "alice@example.com"


def test_forged_expired_and_foreign_capabilities_are_refused() -> None:
    key = new_key()
    ring = Keyring.single(key)
    token = mint_capability(key, "alice", AGENT, 60, now=1000)
    head, payload, signature = token.split(".")
    with pytest.raises(Unauthenticated, match="signature"):
        verify_capability(Keyring.single(new_key()), mint_capability(key, "alice", AGENT, 60), AGENT)
    with pytest.raises(Unauthenticated, match="signature"):
        bob = mint_capability(key, "bob", AGENT, 60, now=1000).split(".")[1]
        verify_capability(ring, f"{head}.{bob}.{signature}", AGENT, now=1001)
    with pytest.raises(Unauthenticated, match="expired"):
        verify_capability(ring, token, AGENT, now=1060)
    with pytest.raises(Forbidden):
        verify_capability(ring, token, OTHER, now=1001)
    for malformed in ("", "smc2", "smc2.a", "x.y.z", f"smc1.{payload}.{signature}", f"smc2.{payload}.{signature}é"):
        with pytest.raises(Unauthenticated):
            verify_capability(ring, malformed, AGENT, now=1001)


def test_the_proxy_enforces_its_maximum_lifetime_whatever_was_minted() -> None:
    key = new_key()
    ring = Keyring.single(key, max_lifetime_seconds=900)
    assert verify_capability(ring, mint_capability(key, "alice", AGENT, 900, now=1000), AGENT, now=1001) == "alice"
    with pytest.raises(Unauthenticated, match="longer than this proxy allows"):
        verify_capability(ring, mint_capability(key, "alice", AGENT, 3600, now=1000), AGENT, now=1001)
    with pytest.raises(Unauthenticated, match="future"):
        verify_capability(ring, mint_capability(key, "alice", AGENT, 60, now=5000), AGENT, now=1000)


@given(st.text(max_size=300))
def test_every_malformed_value_is_a_typed_401(value: str) -> None:
    """Non-ASCII, truncated, re-encoded or random header values: always Unauthenticated, never another error."""
    ring = Keyring.single(b"k" * 32)
    for candidate in (value, f"smc2.{value}", f"smc2.{value}.{value}", f"smc2.eyJ9.{value}"):
        with pytest.raises(Unauthenticated):
            verify_capability(ring, candidate, AGENT)


def test_rotation_overlaps_and_keeps_every_bucket() -> None:
    """During the overlap both signing keys verify; before, during and after it a user has one bucket."""
    old, new, bucket_key = new_key(), new_key(), new_key()
    before = Keyring({"old": old}, bucket_key)
    during = Keyring({"old": old, "new": new}, bucket_key)
    after = Keyring({"new": new}, bucket_key)
    from_old = mint_capability(old, "alice", AGENT, 60, kid="old")
    from_new = mint_capability(new, "alice", AGENT, 60, kid="new")
    assert verify_capability(before, from_old, AGENT) == "alice"
    assert verify_capability(during, from_old, AGENT) == verify_capability(during, from_new, AGENT) == "alice"
    assert verify_capability(after, from_new, AGENT) == "alice"
    with pytest.raises(Unauthenticated, match="unknown key"):
        verify_capability(after, from_old, AGENT)
    with pytest.raises(Unauthenticated, match="unknown key"):
        verify_capability(before, from_new, AGENT)
    assert (
        user_bucket(before, AGENT, "alice") == user_bucket(during, AGENT, "alice") == user_bucket(after, AGENT, "alice")
    )
    with pytest.raises(Unauthenticated, match="signature"):
        verify_capability(during, mint_capability(old, "alice", AGENT, 60, kid="new"), AGENT)


def test_keyring_loads_a_mounted_secret_folder_and_keeps_legacy_buckets(tmp_path: Path) -> None:
    legacy = new_key()
    single = tmp_path / "key"
    single.write_bytes(legacy + b"\n")
    legacy_ring = Keyring.load(single)
    assert verify_capability(legacy_ring, mint_capability(legacy, "alice", AGENT, 60), AGENT) == "alice"

    folder = tmp_path / "keys"
    folder.mkdir()
    (folder / "default").write_bytes(legacy)
    (folder / "2026-12").write_bytes(new_key())
    (folder / "..data").mkdir()  # what a Kubernetes Secret volume holds besides its keys
    with pytest.raises(ValueError, match="bucket key"):
        Keyring.load(folder)
    bucket_file = tmp_path / "bucket"
    bucket_file.write_bytes(legacy)  # the legacy key stays the bucket key: nobody moves
    rotated = Keyring.load(folder, bucket_file)
    assert sorted(rotated.signing_keys) == ["2026-12", "default"]
    assert user_bucket(rotated, AGENT, "alice") == user_bucket(legacy_ring, AGENT, "alice")


def test_buckets_are_opaque_stable_and_distinct() -> None:
    ring = Keyring.single(new_key())
    alice, bob = user_bucket(ring, AGENT, "alice"), user_bucket(ring, AGENT, "bob")
    assert alice == user_bucket(ring, AGENT, "alice") and alice != bob
    assert alice != user_bucket(ring, OTHER, "alice"), "the same user gets another bucket with another agent"
    assert "alice" not in per_user_key(AGENT, alice, "c1")


def test_short_keys_and_bad_key_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        mint_capability(b"short", "alice", AGENT, 60)
    with pytest.raises(ValueError, match="key id"):
        mint_capability(new_key(), "alice", AGENT, 60, kid="a/b")
    with pytest.raises(ValueError, match="key id"):
        Keyring({"": new_key()}, new_key())


def test_cli_mints_a_verifiable_capability(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = new_key()
    key_file = tmp_path / "key"
    key_file.write_bytes(key)
    args = ["--key-file", str(key_file), "--kid", "k2", "--subject", "carol", "--agent", "team-a/support-agent"]
    assert main(args) == 0
    ring = Keyring({"k2": key}, new_key())
    assert verify_capability(ring, capsys.readouterr().out.strip(), AGENT) == "carol"
