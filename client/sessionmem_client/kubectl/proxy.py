"""The proxy's admin routes, called with the caller's own bearer token; and the port-forward that reaches
them from a workstation."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator, Sequence
from typing import BinaryIO, TypeVar

import httpx
from pydantic import BaseModel

from sessionmem_client.kubectl.errors import PluginError
from sessionmem_core import api, wire
from sessionmem_core.errors import SessionMemError, from_wire

_Model = TypeVar("_Model", bound=BaseModel)
_FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) ->")
PORT_FORWARD_TIMEOUT_SECONDS = 30.0
# Listing pages the plugin asks for; the proxy bounds them too.
PAGE_SIZE = 200


def _path(template: str, **values: str) -> str:
    return template.format(**{name: api.quote_component(value) for name, value in values.items()})


def proxy_error(exc: SessionMemError) -> PluginError:
    """``Forbidden: user 'x' cannot delete agentdeployments/memory 'a' in namespace 'n'``."""
    title = "".join(part.capitalize() for part in exc.error_type.split("_")) or "Error"
    return PluginError(exc.message, title)


class AdminClient:
    """One person's calls to the proxy's admin routes."""

    def __init__(self, base_url: str, bearer_token: str, timeout: float) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": f"Bearer {bearer_token}"}, timeout=timeout
        )

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, params: dict[str, str], model: type[_Model]) -> _Model:
        try:
            response = await self._http.request(method, path, params=params)
        except httpx.HTTPError as exc:
            raise PluginError(f"cannot reach the memory proxy at {self._http.base_url}: {exc}") from exc
        if response.status_code != 200:
            raise proxy_error(from_wire(response.status_code, response.content))
        return model.model_validate_json(response.content)

    async def stats(self, namespace: str, agent: str) -> wire.AgentMemoryStats:
        path = _path(api.ADMIN_STATS_PATH, namespace=namespace, agent=agent)
        return await self._call("GET", path, {}, wire.AgentMemoryStats)

    async def conversations(
        self, namespace: str, agent: str, user: str | None, limit: int
    ) -> list[wire.AdminConversation]:
        """Up to ``limit`` conversations, following the proxy's cursors."""
        path = _path(api.ADMIN_CONVERSATIONS_PATH, namespace=namespace, agent=agent)
        found: list[wire.AdminConversation] = []
        cursor = "0"
        while len(found) < limit:
            params = {"limit": str(min(PAGE_SIZE, limit - len(found))), "cursor": cursor}
            if user is not None:
                params[api.ADMIN_USER_QUERY] = user
            page = await self._call("GET", path, params, wire.AdminConversationList)
            found += page.conversations
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        return found[:limit]

    async def show(
        self, namespace: str, agent: str, conversation: str, last: int, user: str | None, bucket: str | None
    ) -> wire.Transcript:
        path = _path(api.ADMIN_CONVERSATION_PATH, namespace=namespace, agent=agent, conversationId=conversation)
        return await self._call("GET", path, {api.ADMIN_LAST_QUERY: str(last), **_space(user, bucket)}, wire.Transcript)

    async def export(
        self,
        namespace: str,
        agent: str,
        conversation: str | None,
        user: str | None,
        bucket: str | None,
        out: BinaryIO,
    ) -> int:
        """Writes JSON lines, one per entry, to ``out``: the named conversation, or each one the listing
        shows (one user's, or all of the agent's); answers how many lines were written. The proxy answers
        an export a page at a time, so each page is written before the next is asked for. A listed
        conversation gone by the time it is read (expired, erased) is skipped."""
        if conversation is not None:
            targets = [(conversation, _space(user, bucket))]
        else:
            listed = await self.conversations(namespace, agent, user, sys.maxsize)
            # A listing may name a conversation twice (Valkey rehashed while it was scanned): export it once.
            spaces = dict.fromkeys((found.conversation_id, found.bucket) for found in listed)
            targets = [(cid, _space(None, found_bucket)) for cid, found_bucket in spaces]
        path = _path(api.ADMIN_EXPORT_PATH, namespace=namespace, agent=agent)
        lines = 0
        for conversation_id, space in targets:
            offset: str | None = "0"
            while offset is not None:
                params = {**space, api.ADMIN_CONVERSATION_QUERY: conversation_id, api.OFFSET_PARAM: offset}
                try:
                    response = await self._http.get(path, params=params)
                except httpx.HTTPError as exc:
                    raise PluginError(f"the export was cut short after {lines} entries: {exc}") from exc
                if response.status_code == 404 and conversation is None and offset == "0":
                    break
                if response.status_code != 200:
                    raise proxy_error(from_wire(response.status_code, response.content))
                out.write(response.content)
                out.flush()
                lines += response.content.count(b"\n")
                offset = response.headers.get(api.NEXT_OFFSET_HEADER)
        return lines

    async def erase(
        self, namespace: str, agent: str, conversation: str | None, user: str | None, bucket: str | None
    ) -> wire.ErasureReceipt:
        if conversation is not None:
            path = _path(api.ADMIN_CONVERSATION_PATH, namespace=namespace, agent=agent, conversationId=conversation)
            return await self._call("DELETE", path, _space(user, bucket), wire.ErasureReceipt)
        if user is not None:
            path = _path(api.ADMIN_USER_MEMORY_PATH, namespace=namespace, agent=agent, user=user)
        else:
            path = _path(api.ADMIN_AGENT_MEMORY_PATH, namespace=namespace, agent=agent)
        return await self._call("DELETE", path, {}, wire.ErasureReceipt)


def _space(user: str | None, bucket: str | None) -> dict[str, str]:
    if user is not None:
        return {api.ADMIN_USER_QUERY: user}
    if bucket is not None:
        return {api.ADMIN_BUCKET_QUERY: bucket}
    return {}


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def plain_http_warning(url: str) -> str | None:
    """Your Kubernetes token goes to the proxy in the Authorization header: say so when that is in the clear
    over a network (a port-forward's loopback, or HTTPS, is not)."""
    parsed = httpx.URL(url)
    if parsed.scheme == "http" and parsed.host not in _LOOPBACK:
        return f"your Kubernetes token is sent to {parsed.host} over plain HTTP"
    return None


def forwarded_port(line: str) -> int | None:
    """The local port of a ``kubectl port-forward`` line (``Forwarding from 127.0.0.1:41234 -> 8000``)."""
    match = _FORWARDING.search(line)
    return int(match.group(1)) if match else None


def port_forward_command(
    kubectl: str, kubeconfig: str | None, context: str | None, namespace: str, service: str, port: int
) -> list[str]:
    """kubectl, with the caller's own kubeconfig and context, forwarding a free local port to the Service."""
    command = [kubectl]
    if kubeconfig:
        command += ["--kubeconfig", kubeconfig]
    if context:
        command += ["--context", context]
    return [*command, "port-forward", "--address", "127.0.0.1", "-n", namespace, f"service/{service}", f":{port}"]


def _hint(problem: str) -> str:
    if "forbidden" not in problem.lower():
        return ""
    return (
        "\nThe port-forward needs, in the proxy's namespace, get on services, get/list/watch on pods and create "
        "on pods/portforward: the Role memory-proxy-port-forward in docs/kubectl.md (or pass --proxy-url)"
    )


@contextlib.asynccontextmanager
async def port_forward(command: Sequence[str]) -> AsyncIterator[str]:
    """Runs ``kubectl port-forward`` for as long as the block runs; yields the proxy's local URL."""
    try:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        raise PluginError(f"cannot run {command[0]} port-forward ({exc}): pass --proxy-url instead") from exc
    try:
        assert process.stdout is not None and process.stderr is not None
        port = None
        async with asyncio.timeout(PORT_FORWARD_TIMEOUT_SECONDS):
            while port is None:
                line = await process.stdout.readline()
                if not line:
                    problem = (await process.stderr.read()).decode(errors="replace").strip()
                    raise PluginError(
                        f"kubectl port-forward to the memory proxy failed: {problem[-500:]}{_hint(problem)}"
                    )
                port = forwarded_port(line.decode(errors="replace"))
        yield f"http://127.0.0.1:{port}"
    except TimeoutError as exc:
        raise PluginError("kubectl port-forward to the memory proxy did not start in time") from exc
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
