"""Data keys for encryption at rest: which unit of memory a key seals, who wraps it, where it is kept.

A *unit* is what one data key (DEK) seals and what one erasure destroys: an agent's private conversations
(``<namespace>/<agent>``), one end user's bucket with a perUser agent (``<namespace>/<agent>:u:<bucket>``)
or a registry's shared conversations (``shared:<registry>``). Its *space* is the agent (or the registry) it
belongs to: erasing an agent destroys the keys of every unit of its space, its users' buckets included.

A DEK is 32 random bytes, wrapped (AES-256-GCM, bound to its unit and id) by a key-encryption key (KEK)
from a ``KeyWrapper``: the ``Keyring`` of keys mounted from a Secret, or a KMS behind the same interface.
New wraps use the newest KEK; every KEK of the keyring still unwraps, so a KEK is rotated by adding one,
re-wrapping (``python -m sessionmem_proxy.datakeys rewrap``) and then removing the old one.

Where the wrapped DEKs are kept decides whether erasure reaches the disk. Kept in the same Valkey as the
conversations, a destroyed DEK would live on in the AOF, the RDB snapshots and the backups next to the
data it sealed, and the KEK that remains would read it all back. So they live outside Valkey, in a
``DataKeyStore``:

- ``SecretDataKeyStore`` (production): one Kubernetes Secret per unit in the proxy's namespace. Deleting it
  is the erasure. etcd keeps a deleted Secret until its next compaction, and an etcd backup keeps it as long
  as the backup lives: with the KEK in the same etcd, a pair of backups (Valkey's and etcd's) taken before
  an erasure can still be read. A KEK from a KMS, or etcd encryption with a KMS provider, closes that.
- ``DirectoryDataKeyStore`` (the embedded stack, tests): one file per unit. An erasure unlinks it, which is
  as final as the filesystem and its backups make it.

Neither store is the conversations' backend: losing it loses the memory it seals, as an erasure would.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import hashlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote

import httpx
import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sessionmem_core.capability import check_kid, key_files, new_key
from sessionmem_core.errors import DataKeyUnavailable, SealedEntryInvalid
from sessionmem_core.keys import data_key_space

if TYPE_CHECKING:
    from sessionmem_core.env import ProxySettings
    from sessionmem_proxy.kubeapi import KubeAPI

KEK_BYTES = 32
DEK_BYTES = 32
NONCE_BYTES = 12
# A DEK id: 8 random bytes as 16 hex characters, stored with every entry it seals.
DEK_ID_BYTES = 8


def new_kek() -> bytes:
    """A fresh KEK as a key file holds it: 64 hex characters (32 bytes), made as the capability keys are."""
    return new_key()


def _wrap_context(unit: str, dek_id: str, kid: str) -> bytes:
    return b"sessionmem-dek\0" + unit.encode() + b"\0" + dek_id.encode() + b"\0" + kid.encode()


@dataclass(frozen=True, slots=True)
class WrappedDataKey:
    """One unit's DEK as stored: wrapped by the KEK ``kid``, never in clear."""

    unit: str
    dek_id: str
    kid: str
    wrapped: bytes
    created: int

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "unit": self.unit,
                "dekId": self.dek_id,
                "kid": self.kid,
                "wrapped": base64.b64encode(self.wrapped).decode(),
                "created": self.created,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> WrappedDataKey:
        """Fail closed: a record that does not parse is a typed error, never a missing key (which would
        mint a new one and orphan what the old one sealed)."""
        try:
            raw = orjson.loads(data)
            if len(bytes.fromhex(str(raw["dekId"]))) != DEK_ID_BYTES:
                raise ValueError("a data key id is 8 bytes")
            return cls(
                unit=str(raw["unit"]),
                dek_id=str(raw["dekId"]),
                kid=str(raw["kid"]),
                wrapped=base64.b64decode(raw["wrapped"], validate=True),
                created=int(raw["created"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise DataKeyUnavailable("a stored data key record is malformed") from exc


class KeyWrapper(Protocol):
    """What wraps and unwraps DEKs: the mounted keyring (``Keyring``), or a KMS (whose ``wrap`` calls its
    encrypt API with its newest key version, and ``unwrap`` its decrypt API with the one ``kid`` names)."""

    @property
    def newest_kid(self) -> str: ...

    async def wrap(self, unit: str, dek_id: str, dek: bytes) -> tuple[str, bytes]:
        """(kid of the KEK used, wrapped DEK)."""
        ...

    async def unwrap(self, record: WrappedDataKey) -> bytes: ...


@dataclass(frozen=True)
class Keyring:
    """KEKs by key id, from a mounted Secret. New wraps use the newest: the greatest key id, so ids that
    sort by date (``2026-12``) roll forward as keys are added."""

    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a data key keyring needs at least one key-encryption key")
        for kid, key in self.keys.items():
            check_kid(kid)
            if len(key) != KEK_BYTES:
                raise ValueError(f"key-encryption key {kid!r} is not {KEK_BYTES} bytes (64 hex characters)")

    @property
    def newest_kid(self) -> str:
        return max(self.keys)

    @classmethod
    def load(cls, path: Path) -> Keyring:
        """KEKs from ``path``: a folder (a mounted Secret: each file is a key named by its id, 64 hex
        characters; Kubernetes' ``..data`` entries are skipped) or one file (id ``default``). Checked at
        start-up, so a bad key stops the proxy instead of failing requests."""
        keys: dict[str, bytes] = {}
        for kid, file in key_files(path).items():
            try:
                keys[kid] = bytes.fromhex(file.read_text().strip())
            except ValueError as exc:
                raise ValueError(f"key-encryption key {kid!r} is not hex") from exc
        return cls(keys)

    async def wrap(self, unit: str, dek_id: str, dek: bytes) -> tuple[str, bytes]:
        kid = self.newest_kid
        nonce = os.urandom(NONCE_BYTES)
        return kid, nonce + AESGCM(self.keys[kid]).encrypt(nonce, dek, _wrap_context(unit, dek_id, kid))

    async def unwrap(self, record: WrappedDataKey) -> bytes:
        """Fail closed: a KEK this keyring lacks is DataKeyUnavailable (503: a rotation removed it too early);
        a wrap that does not open under its unit and id is SealedEntryInvalid (it was tampered with or moved)."""
        key = self.keys.get(record.kid)
        if key is None:
            raise DataKeyUnavailable(f"the key-encryption key {record.kid!r} is not in the keyring")
        nonce, body = record.wrapped[:NONCE_BYTES], record.wrapped[NONCE_BYTES:]
        try:
            return AESGCM(key).decrypt(nonce, body, _wrap_context(record.unit, record.dek_id, record.kid))
        except InvalidTag as exc:
            raise SealedEntryInvalid(f"the data key of {record.unit!r} does not open under its context") from exc


class DataKeyStore(Protocol):
    """Where wrapped DEKs live, one per unit (see the module's docstring for why not in Valkey)."""

    async def load(self, unit: str) -> WrappedDataKey | None: ...

    async def create(self, record: WrappedDataKey) -> WrappedDataKey:
        """Store a unit's first DEK; when another replica stored one first, answer that one instead."""
        ...

    async def rewrapped(self, record: WrappedDataKey) -> None:
        """Replace a unit's record by the same DEK wrapped anew (same unit and DEK id)."""
        ...

    async def destroy(self, unit: str, whole_space: bool) -> list[str]:
        """Destroy the DEK of ``unit`` (with ``whole_space``: of every unit of its space); answers the
        units whose DEK was destroyed."""
        ...

    async def records(self) -> list[WrappedDataKey]: ...


def _digest(text: str, length: int = 40) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


class DirectoryDataKeyStore:
    """One file per unit under ``root/<space digest>/<unit digest>.json`` (the embedded stack and tests)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, unit: str) -> Path:
        return self._root / _digest(data_key_space(unit)) / f"{_digest(unit)}.json"

    async def load(self, unit: str) -> WrappedDataKey | None:
        try:
            data = self._path(unit).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DataKeyUnavailable(f"data key store unreadable: {type(exc).__name__}") from exc
        return WrappedDataKey.from_json(data)

    async def create(self, record: WrappedDataKey) -> WrappedDataKey:
        path = self._path(record.unit)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written aside, then linked into place: a link never replaces an existing file, so of two
            # writers the first wins and a reader never sees half a record.
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
                tmp.write(record.to_json())
            try:
                os.link(tmp.name, path)
            except FileExistsError:
                existing = await self.load(record.unit)
                if existing is None:
                    raise DataKeyUnavailable("a data key vanished while it was created") from None
                return existing
            finally:
                os.unlink(tmp.name)
        except OSError as exc:
            raise DataKeyUnavailable(f"data key store unwritable: {type(exc).__name__}") from exc
        return record

    async def rewrapped(self, record: WrappedDataKey) -> None:
        path = self._path(record.unit)
        try:
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
                tmp.write(record.to_json())
            os.replace(tmp.name, path)
        except OSError as exc:
            raise DataKeyUnavailable(f"data key store unwritable: {type(exc).__name__}") from exc

    async def destroy(self, unit: str, whole_space: bool) -> list[str]:
        """Fail closed: a key that cannot be removed is DataKeyUnavailable, and the erasure stops there."""
        paths = sorted(self._path(unit).parent.glob("*.json")) if whole_space else [self._path(unit)]
        destroyed: list[str] = []
        for path in paths:
            try:
                record = WrappedDataKey.from_json(path.read_bytes())
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise DataKeyUnavailable(f"data key not destroyed: {type(exc).__name__}") from exc
            destroyed.append(record.unit)
        return sorted(destroyed)

    async def records(self) -> list[WrappedDataKey]:
        return [WrappedDataKey.from_json(p.read_bytes()) for p in sorted(self._root.glob("*/*.json"))]


# The Secrets of the Kubernetes store: named by their unit's digest, labelled by their space's, so that one
# DELETE (a collection, by label) erases an agent's units.
SECRET_TYPE = "sessionmem.ctxmesh.ai/data-key"
SPACE_LABEL = "sessionmem.ctxmesh.ai/data-key-space"
UNIT_ANNOTATION = "sessionmem.ctxmesh.ai/unit"
_MANAGED = {"app.kubernetes.io/managed-by": "sessionmem-proxy"}
# Secrets per page when every data key is listed (the re-wrap command).
_PAGE = 500


def secret_name(unit: str) -> str:
    return f"sessionmem-dek-{_digest(unit)}"


class SecretDataKeyStore:
    """One Secret per unit in the proxy's own namespace, through the API server (``kubeapi.KubeAPI``).
    The proxy's Role grants get, create, update, delete and list on Secrets there (the chart's, when
    sealing is on). Fail closed: an API server that cannot be asked, or refuses, is DataKeyUnavailable
    (503), never a new key."""

    def __init__(self, http: httpx.AsyncClient, bearer: BearerSource, namespace: str, page: int = _PAGE) -> None:
        self._http = http
        self._bearer = bearer
        self._page = page
        self._base = f"/api/v1/namespaces/{quote(namespace, safe='')}/secrets"

    async def _call(self, method: str, path: str, body: object = None, ok: Sequence[int] = (200,)) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self._bearer()}", "Content-Type": "application/json"}
        try:
            response = await self._http.request(
                method, path, content=None if body is None else orjson.dumps(body), headers=headers
            )
        except (httpx.HTTPError, OSError) as exc:
            raise DataKeyUnavailable(f"data key store unavailable: {type(exc).__name__}") from exc
        if response.status_code not in ok:
            raise DataKeyUnavailable(f"data key store answered HTTP {response.status_code} to {method}")
        return response

    @staticmethod
    def _record(secret: Mapping[str, object]) -> WrappedDataKey:
        data = secret.get("data")
        raw = data.get("record") if isinstance(data, dict) else None
        if not isinstance(raw, str):
            raise DataKeyUnavailable("a data key Secret holds no record")
        try:
            return WrappedDataKey.from_json(base64.b64decode(raw, validate=True))
        except binascii.Error as exc:
            raise DataKeyUnavailable("a data key Secret is malformed") from exc

    def _secret(self, record: WrappedDataKey, resource_version: str | None = None) -> dict[str, object]:
        metadata: dict[str, object] = {
            "name": secret_name(record.unit),
            "labels": {**_MANAGED, SPACE_LABEL: _digest(data_key_space(record.unit))},
            "annotations": {UNIT_ANNOTATION: record.unit},
        }
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": SECRET_TYPE,
            "metadata": metadata,
            "data": {"record": base64.b64encode(record.to_json()).decode()},
        }

    async def load(self, unit: str) -> WrappedDataKey | None:
        response = await self._call("GET", f"{self._base}/{secret_name(unit)}", ok=(200, 404))
        if response.status_code == 404:
            return None
        return self._record(orjson.loads(response.content))

    async def create(self, record: WrappedDataKey) -> WrappedDataKey:
        response = await self._call("POST", self._base, self._secret(record), ok=(201, 409))
        if response.status_code == 201:
            return record
        existing = await self.load(record.unit)
        if existing is None:
            raise DataKeyUnavailable("a data key vanished while it was created")
        return existing

    async def rewrapped(self, record: WrappedDataKey) -> None:
        path = f"{self._base}/{secret_name(record.unit)}"
        current = orjson.loads((await self._call("GET", path)).content)
        await self._call("PUT", path, self._secret(record, current["metadata"]["resourceVersion"]))

    async def destroy(self, unit: str, whole_space: bool) -> list[str]:
        if not whole_space:
            response = await self._call("DELETE", f"{self._base}/{secret_name(unit)}", ok=(200, 202, 404))
            return [unit] if response.status_code != 404 else []
        selector = f"{SPACE_LABEL}={_digest(data_key_space(unit))}"
        listed = orjson.loads((await self._call("GET", f"{self._base}?labelSelector={selector}")).content)
        units = sorted(self._record(item).unit for item in listed.get("items") or [])
        # One call for the space, and no Secret of another space can match its label.
        await self._call("DELETE", f"{self._base}?labelSelector={selector}", ok=(200, 202))
        return units

    async def records(self) -> list[WrappedDataKey]:
        """Every data key, listed in pages (a perUser agent has one per user)."""
        found: list[WrappedDataKey] = []
        token = ""
        while True:
            query = f"labelSelector=app.kubernetes.io/managed-by%3Dsessionmem-proxy&limit={self._page}"
            if token:
                query += f"&continue={quote(token, safe='')}"
            listed = orjson.loads((await self._call("GET", f"{self._base}?{query}")).content)
            found += [self._record(item) for item in listed.get("items") or [] if item.get("type") == SECRET_TYPE]
            token = (listed.get("metadata") or {}).get("continue") or ""
            if not token:
                return found


class BearerSource(Protocol):
    def __call__(self) -> str: ...


def new_record_id() -> str:
    return secrets.token_hex(DEK_ID_BYTES)


async def new_data_key(wrapper: KeyWrapper, unit: str) -> tuple[WrappedDataKey, bytes]:
    """A fresh DEK for ``unit``: (its record, the key in clear)."""
    dek, dek_id = AESGCM.generate_key(bit_length=DEK_BYTES * 8), new_record_id()
    kid, wrapped = await wrapper.wrap(unit, dek_id, dek)
    return WrappedDataKey(unit, dek_id, kid, wrapped, int(time.time())), dek


async def rewrap(wrapper: KeyWrapper, store: DataKeyStore) -> tuple[int, int]:
    """Wrap every stored DEK with the newest KEK: (re-wrapped, already current). Run after adding a KEK;
    the old KEK can leave the keyring once this reports nothing left to do."""
    done = current = 0
    for record in await store.records():
        if record.kid == wrapper.newest_kid:
            current += 1
            continue
        dek = await wrapper.unwrap(record)
        kid, wrapped = await wrapper.wrap(record.unit, record.dek_id, dek)
        await store.rewrapped(WrappedDataKey(record.unit, record.dek_id, kid, wrapped, record.created))
        done += 1
    return done, current


Closer = Callable[[], Awaitable[None]]


def key_store_from_settings(
    settings: ProxySettings, kube: Callable[[ProxySettings], KubeAPI]
) -> tuple[DataKeyStore, Closer | None]:
    """The data key store the settings name, and what closes the HTTP client it owns (if any)."""
    if settings.sealing_key_store == "directory":
        if not settings.sealing_key_dir:
            raise ValueError("the directory data key store needs SESSIONMEM_SEALING_KEY_DIR")
        return DirectoryDataKeyStore(Path(settings.sealing_key_dir)), None
    if not settings.sealing_namespace:
        raise ValueError("the Secret data key store needs SESSIONMEM_SEALING_NAMESPACE (the proxy's namespace)")
    api = kube(settings)
    http = api.client()
    return SecretDataKeyStore(http, api.bearer, settings.sealing_namespace), http.aclose


def main(argv: list[str] | None = None) -> int:
    """``new-key`` prints a KEK for the keyring's Secret; ``rewrap`` re-wraps the stored DEKs with the
    newest KEK, with the proxy's own settings (run it in a proxy pod: ``kubectl exec``)."""
    parser = argparse.ArgumentParser(description="sessionmem data keys (encryption at rest)")
    parser.add_argument("command", choices=("new-key", "rewrap"))
    args = parser.parse_args(argv)
    if args.command == "new-key":
        print(new_kek().decode())
        return 0
    from sessionmem_core.env import ProxySettings
    from sessionmem_proxy.kubeapi import KubeAPI

    settings = ProxySettings.from_env()
    if settings.sealing_keyring is None:
        parser.error("sealing is not configured (SESSIONMEM_SEALING_KEYRING is unset)")
    keyring = Path(settings.sealing_keyring)

    async def run() -> tuple[int, int]:
        store, closer = key_store_from_settings(settings, KubeAPI.from_settings)
        try:
            return await rewrap(Keyring.load(keyring), store)
        finally:
            if closer is not None:
                await closer()

    done, current = asyncio.run(run())
    print(f"re-wrapped {done} data keys; {current} already under the newest key")
    return 0


if __name__ == "__main__":
    sys.exit(main())
