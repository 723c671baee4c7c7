"""The containers' security contexts (pure): Pod Security Standards' `restricted` profile by default.

The launcher holds the pod's proxy token, so it always runs restricted with a read-only root filesystem,
whatever the AgentDeployment says. The agent container runs restricted too unless `spec.securityContext`
says otherwise: each field set there replaces the default's (e.g. `runAsNonRoot: false` for an image that
must run as root, which a `restricted` namespace then refuses, visibly).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

# What `restricted` asks of every container (pod-security.kubernetes.io/enforce: restricted).
RESTRICTED: Mapping[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# The only capability `restricted` (and Knative, by default) lets a container add.
ADDABLE_CAPABILITIES = ("NET_BIND_SERVICE",)


def launcher_security_context() -> dict[str, Any]:
    return {**copy.deepcopy(dict(RESTRICTED)), "readOnlyRootFilesystem": True}


def agent_security_context(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`restricted`, with each field of `overrides` (spec.securityContext) replacing the default's."""
    return {**copy.deepcopy(dict(RESTRICTED)), **copy.deepcopy(dict(overrides))}
