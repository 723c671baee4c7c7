"""What store-level tests hand the proxy's store: a storage quota that never refuses (the tests are about
the write, not the quota)."""

from __future__ import annotations

from sessionmem_proxy.store import StorageQuota


class _Unlimited:
    max_conversations = 1000
    max_bytes = 1 << 40


UNLIMITED_QUOTA: StorageQuota = _Unlimited()
