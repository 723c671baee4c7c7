"""Profiling what-ifs: the real proxy app with one change applied at start-up, to measure a recommended
fix before anyone makes it (nothing under proxy/ is changed; uvicorn serves these factories).

    SESSIONMEM_AUTH_MODE=dev ... python -m uvicorn bench.whatif:proxy_async_context --factory ...
"""

from __future__ import annotations

import typing

from fastapi import FastAPI, Request


def proxy_as_is() -> FastAPI:
    from sessionmem_proxy.app import create_app

    return create_app()


def proxy_async_context() -> FastAPI:
    """The proxy with its ``Ctx`` dependency (sessionmem_proxy.context._context, a plain ``def``, which
    FastAPI runs in a thread pool) replaced by the same function as ``async def``."""
    from sessionmem_proxy import context
    from sessionmem_proxy.app import create_app

    async def _async_context(request: Request) -> context.ProxyContext:
        ctx: context.ProxyContext = request.app.state.ctx
        return ctx

    depends = typing.get_args(context.Ctx)[1]
    object.__setattr__(depends, "dependency", _async_context)
    return create_app()
