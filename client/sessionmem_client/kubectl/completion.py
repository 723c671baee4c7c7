"""Shell completion through kubectl's plugin completion (kubectl 1.26+): for ``kubectl sessionmem <TAB>``
kubectl runs ``kubectl_complete-sessionmem <words so far> <word being completed>`` and reads candidates, one
a line, then a Cobra directive line (``:4``: no file names)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from sessionmem_client.kubectl import agents
from sessionmem_client.kubectl.access import load_access
from sessionmem_client.kubectl.cli import COMMANDS, OUTPUTS, parser

NO_FILE_COMPLETION = ":4"
LOOKUP_TIMEOUT_SECONDS = 5.0
_TAKES_VALUE = frozenset(
    {"-n", "--namespace", "--context", "--kubeconfig", "--proxy-url", "--proxy-namespace", "--proxy-service",
     "--request-timeout", "-o", "--output", "--user", "--bucket", "--limit", "--last"}
)  # fmt: skip


def _subparser(command: str) -> argparse.ArgumentParser:
    top = parser()
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[command]
            return found
    raise KeyError(command)


def _flags(command: str) -> list[str]:
    return sorted(option for action in _subparser(command)._actions for option in action.option_strings)


def candidates(words: Sequence[str]) -> list[str]:
    """What may come next, from the words typed so far (the last one is the word being completed)."""
    *before, current = words or [""]
    command = next((w for w in before if w in COMMANDS), None)
    if command is None:
        return [c for c in COMMANDS if c.startswith(current)]
    previous = before[-1] if before else ""
    if previous in ("-o", "--output"):
        return [o for o in OUTPUTS if o.startswith(current)]
    if previous in ("-n", "--namespace"):
        return [n for n in _lookup(_namespaces(before)) if n.startswith(current)]
    if previous in _TAKES_VALUE:
        return []
    if current.startswith("-"):
        return [f for f in _flags(command) if f.startswith(current)]
    positionals = [
        w for i, w in enumerate(before) if w != command and not w.startswith("-") and before[i - 1] not in _TAKES_VALUE
    ]
    if not positionals:
        return [a for a in _lookup(_agents(before)) if a.startswith(current)]
    return []


def _option(words: Sequence[str], *names: str) -> str | None:
    for i, word in enumerate(words[:-1]):
        if word in names:
            return words[i + 1]
    return None


async def _agents(words: Sequence[str]) -> list[str]:
    access = await load_access(_option(words, "--kubeconfig"), _option(words, "--context"))
    namespace = _option(words, "-n", "--namespace") or access.namespace
    return [a.name for a in await agents.read_agents(access, namespace, None) if a.enabled]


async def _namespaces(words: Sequence[str]) -> list[str]:
    from kubernetes_asyncio import client as kube_client

    access = await load_access(_option(words, "--kubeconfig"), _option(words, "--context"))
    async with kube_client.ApiClient(configuration=access.configuration) as api_client:
        listing = await kube_client.CoreV1Api(api_client).list_namespace()
    return sorted(str(item.metadata.name) for item in listing.items)


def _lookup(lookup: Coroutine[Any, Any, list[str]]) -> list[str]:
    """Names from the cluster, or none when it cannot be asked quickly: completion never fails loudly
    (a kubeconfig it cannot use, an API server that refuses or does not answer: no candidates)."""

    async def bounded() -> list[str]:
        async with asyncio.timeout(LOOKUP_TIMEOUT_SECONDS):
            return await lookup

    try:
        return asyncio.run(bounded())
    except Exception:
        return []


def run(argv: Sequence[str]) -> int:
    for candidate in candidates(list(argv)):
        sys.stdout.write(candidate + "\n")
    sys.stdout.write(NO_FILE_COMPLETION + "\n")
    return 0
