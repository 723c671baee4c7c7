"""``kubectl sessionmem``: see, export and erase an agent's memory with the caller's own Kubernetes identity.

The caller's bearer token (from their kubeconfig: a token, a token file, or exec/auth-provider credentials,
as kubernetes_asyncio resolves them) goes to the proxy's admin routes, reached through a port-forward to the
proxy's Service (or ``--proxy-url``); the proxy asks the API server who it is (TokenReview) and whether they
may (SubjectAccessReview on ``agentdeployments/memory``). No Valkey credential ever leaves the cluster.
docs/kubectl.md says why this path and not an aggregated API.

Its dependencies are the ``kubectl`` extra of the client distribution (packaging/client), from a checkout:
``pip install './packaging/client[kubectl]'``.
"""

from __future__ import annotations

import sys

EXTRA_HINT = (
    "kubectl sessionmem needs the client's kubectl extra: from a checkout of sessionmem, "
    "pip install './packaging/client[kubectl]'"
)


def main() -> None:
    """The ``kubectl-sessionmem`` console script."""
    try:
        from sessionmem_client.kubectl.cli import run
    except ModuleNotFoundError as exc:  # the extra is not installed
        print(f"error: {EXTRA_HINT} ({exc.name} is missing)", file=sys.stderr)
        raise SystemExit(1) from exc
    raise SystemExit(run(sys.argv[1:]))


def complete() -> None:
    """The ``kubectl_complete-sessionmem`` console script: kubectl runs it to complete ``kubectl sessionmem``."""
    try:
        from sessionmem_client.kubectl.completion import run
    except ModuleNotFoundError:
        print(":4")  # no candidates, and no file names either
        raise SystemExit(0) from None
    raise SystemExit(run(sys.argv[1:]))
