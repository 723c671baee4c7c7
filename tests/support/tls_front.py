"""A TLS front for a plain Valkey: terminates TLS (optionally requiring client certificates signed by a
CA) and passes each connection's bytes to the server and back. Standard library only, so the same file
runs in-process for the test tiers (tests/support/tls.py) and as a script in a pod of the e2e tier, in
front of a valkey-server built without TLS.

    python tls_front.py LISTEN_PORT TARGET_HOST:TARGET_PORT CERT KEY [CLIENT_CA]
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys


def server_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(host: str, port: int, target_host: str, target_port: int, context: ssl.SSLContext) -> asyncio.Server:
    """Listening on (host, port) with TLS; each accepted connection is relayed to the target."""

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        peer = client_writer.get_extra_info("peercert")
        print(f"tls-front: connection, client certificate: {bool(peer)}", flush=True)
        try:
            server_reader, server_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _pipe(client_reader, server_writer), _pipe(server_reader, client_writer), return_exceptions=True
        )

    return await asyncio.start_server(relay, host, port, ssl=context)


async def _main(argv: list[str]) -> None:
    listen_port, target, cert, key, *client_ca = argv
    target_host, _, target_port = target.rpartition(":")
    context = server_context(cert, key, client_ca[0] if client_ca else None)
    server = await serve("0.0.0.0", int(listen_port), target_host, int(target_port), context)
    print(f"tls-front: listening on {listen_port}, relaying to {target}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
