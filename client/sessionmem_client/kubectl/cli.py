"""The command line of ``kubectl sessionmem`` (argparse: no CLI library is a dependency of the project)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

from sessionmem_client.kubectl import agents, proxy
from sessionmem_client.kubectl.access import KubeAccess, load_access
from sessionmem_client.kubectl.errors import PluginError
from sessionmem_core import env, wire

COMMANDS = ("status", "conversations", "show", "export", "erase")
# The commands about one agent's memory: its AgentDeployment must exist (status says so on its own).
AGENT_COMMANDS = ("conversations", "show", "export", "erase")
OUTPUTS = ("table", "json", "yaml")
DEFAULT_TIMEOUT_SECONDS = 30.0


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="namespace of the AgentDeployment (default: the context's)")
    common.add_argument("--context", help="the kubeconfig context to use")
    common.add_argument("--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    common.add_argument(
        "--proxy-url",
        default=os.environ.get(env.KUBECTL_PROXY_URL),
        help=f"the memory proxy's URL, reachable from here (${env.KUBECTL_PROXY_URL}); default: a port-forward",
    )
    common.add_argument(
        "--proxy-namespace", default=env.DEFAULT_KUBECTL_PROXY_NAMESPACE, help="namespace of the proxy Service"
    )
    common.add_argument("--proxy-service", default=env.DEFAULT_KUBECTL_PROXY_SERVICE, help="the proxy Service")
    common.add_argument("--request-timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, help="seconds per call")
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format")
    space = argparse.ArgumentParser(add_help=False)
    who = space.add_mutually_exclusive_group()
    who.add_argument("--user", help="an end user's memory with a perUser agent (their id, as capabilities name it)")
    who.add_argument("--bucket", help="a user bucket, as `conversations` shows it")

    top = argparse.ArgumentParser(
        prog="kubectl sessionmem",
        description="See, export and erase agents' conversation memory, as yourself (Kubernetes RBAC on "
        "agentdeployments/memory).",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = sub.add_parser("status", parents=[common, output], help="agents with memory, and what they hold")
    status.add_argument("-A", "--all-namespaces", action="store_true", help="agents of every namespace")
    status.add_argument("agent", nargs="?", help="one AgentDeployment")
    listing = sub.add_parser("conversations", parents=[common, output], help="an agent's conversations")
    listing.add_argument("agent")
    listing.add_argument("--user", help="only this end user's conversations (perUser agents)")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    show = sub.add_parser("show", parents=[common, output, space], help="one conversation's transcript")
    show.add_argument("agent")
    show.add_argument("conversation")
    show.add_argument("--last", type=int, default=env.DEFAULT_CAP, help="only the newest N entries")
    export = sub.add_parser("export", parents=[common, space], help="JSON lines of an agent's memory, to stdout")
    export.add_argument("agent")
    export.add_argument("conversation", nargs="?", help="only this conversation")
    erase = sub.add_parser("erase", parents=[common, output], help="erase memory, printing the receipt")
    erase.add_argument("agent")
    target = erase.add_mutually_exclusive_group(required=True)
    target.add_argument("conversation", nargs="?", help="one conversation")
    target.add_argument("--user", help="one end user's memory with this agent")
    target.add_argument("--all", action="store_true", help="all of the agent's memory, its users' included")
    erase.add_argument("--bucket", help="with a conversation: the user bucket it is in")
    erase.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    return top


def run(argv: Sequence[str], stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = parser().parse_args(list(argv))
    try:
        asyncio.run(_dispatch(args, out, err))
    except PluginError as exc:
        print(exc, file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


async def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    access = await load_access(args.kubeconfig, args.context)
    namespace = args.namespace or access.namespace
    handlers = {
        "status": _status,
        "conversations": _conversations,
        "show": _show,
        "export": _export,
        "erase": _erase,
    }
    if args.command in AGENT_COMMANDS:
        await agents.require_agent(access, namespace, args.agent)
    await handlers[args.command](args, access, namespace, out, err)


@contextlib.asynccontextmanager
async def _admin(args: argparse.Namespace, access: KubeAccess) -> AsyncIterator[proxy.AdminClient]:
    token = access.require_bearer_token()
    if args.proxy_url:
        warning = proxy.plain_http_warning(args.proxy_url)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        async with proxy.AdminClient(args.proxy_url, token, args.request_timeout) as client:
            yield client
        return
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise PluginError("kubectl is not on PATH to port-forward to the memory proxy: pass --proxy-url")
    port = await agents.proxy_service_port(access, args.proxy_namespace, args.proxy_service)
    command = proxy.port_forward_command(
        kubectl, args.kubeconfig, args.context, args.proxy_namespace, args.proxy_service, port
    )
    async with (
        proxy.port_forward(command) as url,
        proxy.AdminClient(url, token, args.request_timeout) as client,
    ):
        yield client


# --- status ---


async def _status(args: argparse.Namespace, access: KubeAccess, namespace: str, out: TextIO, err: TextIO) -> None:
    scope = None if args.all_namespaces and args.agent is None else namespace
    if args.agent is not None:
        found = [await agents.require_agent(access, namespace, args.agent)]
    else:
        found = [a for a in await agents.read_agents(access, scope, None) if a.enabled]
    rows: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(_admin(args, access)) if any(a.enabled for a in found) else None
        for agent in found:
            row: dict[str, Any] = {
                "namespace": agent.namespace,
                "agent": agent.name,
                "scope": agent.scope,
                "requestedScope": agent.requested_scope,
                "perUser": agent.per_user,
                "memoryReady": agent.memory_ready,
                "reason": agent.reason,
                "message": agent.message,
            }
            if agent.enabled and client is not None:
                try:
                    row["stats"] = (await client.stats(agent.namespace, agent.name)).model_dump(by_alias=True)
                except PluginError as exc:
                    row["statsError"] = str(exc)
                    print(f"{agent.namespace}/{agent.name}: {exc}", file=err)
            rows.append(row)
    if args.output != "table":
        _dump(rows, args.output, out)
        return
    if not rows:
        where = "any namespace" if scope is None else f"namespace {scope}"
        print(f"No AgentDeployments with sessionMemory in {where}.", file=err)
        return
    header = ["NAMESPACE"] if scope is None else []
    header += ["AGENT", "SCOPE", "PERUSER", "MEMORYREADY", "REASON", "CONVERSATIONS", "BYTES", "OLDEST", "NEWEST"]
    table = []
    for row in rows:
        stats = row.get("stats") or {}
        line = [row["namespace"]] if scope is None else []
        line += [
            row["agent"],
            row["scope"],
            str(row["perUser"]).lower(),
            row["memoryReady"],
            row["reason"] or "-",
            _of(stats.get("conversations"), stats.get("quotaConversations")),
            _of(stats.get("bytes"), stats.get("quotaBytes")),
            _when(stats.get("oldestWriteTs")),
            _when(stats.get("newestWriteTs")),
        ]
        table.append(line)
    _table(header, table, out)


def _of(used: int | None, quota: int | None) -> str:
    if used is None:
        return "?"
    return f"{used}/{quota}" if quota is not None else str(used)


# --- conversations, show, export, erase ---


async def _conversations(
    args: argparse.Namespace, access: KubeAccess, namespace: str, out: TextIO, err: TextIO
) -> None:
    if args.limit < 1:
        raise PluginError("--limit must be at least 1")
    async with _admin(args, access) as client:
        found = await client.conversations(namespace, args.agent, args.user, args.limit)
    if args.output != "table":
        _dump([c.model_dump(by_alias=True) for c in found], args.output, out)
        return
    if not found:
        print(f"No conversations stored for {namespace}/{args.agent}.", file=err)
        return
    rows = [
        [c.conversation_id, c.bucket or "-", str(c.entries), str(c.version), _when(c.newest_ts), _ttl(c.ttl_seconds)]
        for c in found
    ]
    _table(["CONVERSATION", "BUCKET", "ENTRIES", "VERSION", "LAST WRITE", "EXPIRES IN"], rows, out)


async def _show(args: argparse.Namespace, access: KubeAccess, namespace: str, out: TextIO, err: TextIO) -> None:
    if args.last < 1:
        raise PluginError("--last must be at least 1")
    async with _admin(args, access) as client:
        transcript = await client.show(namespace, args.agent, args.conversation, args.last, args.user, args.bucket)
    if args.output != "table":
        _dump(transcript.model_dump(by_alias=True, mode="json"), args.output, out)
        return
    out.write(render_transcript(transcript))


def render_transcript(transcript: wire.Transcript) -> str:
    """A readable transcript: who wrote each entry (role and writer), when, and what, oldest first."""
    shown = len(transcript.entries)
    where = f" (bucket {transcript.bucket})" if transcript.bucket else ""
    lines = [
        f"Conversation {transcript.conversation_id} of {transcript.namespace}/{transcript.agent}{where}",
        f"{transcript.total} entries, version {transcript.version}, expires in {_ttl(transcript.ttl_seconds)}"
        + (f"; the newest {shown} shown" if shown < transcript.total else ""),
        "",
    ]
    for entry in transcript.entries:
        lines.append(f"[{_when(entry.ts)}] {entry.role} (written by {entry.author}):")
        lines += [f"    {line}" for line in (entry.content.splitlines() or [""])]
    return "\n".join(lines) + "\n"


async def _export(args: argparse.Namespace, access: KubeAccess, namespace: str, out: TextIO, err: TextIO) -> None:
    binary = getattr(out, "buffer", None)
    if binary is None:
        raise PluginError("the export needs a binary standard output")
    out.flush()
    async with _admin(args, access) as client:
        lines = await client.export(namespace, args.agent, args.conversation, args.user, args.bucket, binary)
    print(f"exported {lines} entries of {namespace}/{args.agent}", file=err)


async def _erase(args: argparse.Namespace, access: KubeAccess, namespace: str, out: TextIO, err: TextIO) -> None:
    if args.bucket is not None and args.conversation is None:
        raise PluginError("--bucket goes with a conversation id")
    if args.conversation is not None:
        what = f"conversation {args.conversation} of {namespace}/{args.agent}"
    elif args.user is not None:
        what = f"every conversation of user {args.user} with {namespace}/{args.agent}"
    else:
        what = f"ALL memory of {namespace}/{args.agent}, its users' included"
    if not args.yes:
        if not sys.stdin.isatty():
            raise PluginError(f"refusing to erase {what} without --yes (no terminal to ask on)")
        print(f"Erase {what}? Type the agent's name to confirm: ", end="", file=err, flush=True)
        if sys.stdin.readline().strip() != args.agent:
            raise PluginError("not confirmed: nothing was erased")
    async with _admin(args, access) as client:
        receipt = await client.erase(namespace, args.agent, args.conversation, args.user, args.bucket)
    if args.output != "table":
        _dump(receipt.model_dump(by_alias=True), args.output, out)
        return
    out.write(render_receipt(receipt))


def render_receipt(receipt: wire.ErasureReceipt) -> str:
    target = f"{receipt.namespace}/{receipt.agent}" + (f" (user {receipt.user})" if receipt.user else "")
    lines = [
        f"Erased by {receipt.erasedBy}: {target}",
        f"{_count(len(receipt.keys), 'conversation key')}, {_count(receipt.entries, 'entry', 'entries')} removed",
        *(f"  {key}" for key in receipt.keys),
    ]
    return "\n".join(lines) + "\n"


# --- formatting ---


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _ttl(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _table(header: list[str], rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    for line in (header, *rows):
        out.write("   ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() + "\n")


def _dump(value: Any, output: str, out: TextIO) -> None:
    if output == "json":
        out.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    else:
        out.write(yaml.safe_dump(value, sort_keys=False, allow_unicode=True))
