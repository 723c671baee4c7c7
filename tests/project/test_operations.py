"""The memory operations are declared once, in the contract (``sessionmem_core.api.MEMORY_OPERATIONS``):
the proxy's route table, the launcher's router and routes, and both OpenAPI documents (made by the one
generator, ``sessionmem_core.openapi``) carry each operation as declared there."""

from __future__ import annotations

from sessionmem_core import api
from sessionmem_launcher import openapi as launcher_openapi
from sessionmem_proxy.openapi import document as proxy_document
from sessionmem_proxy.routes import ROUTES


def test_the_proxy_serves_each_operation_as_the_contract_declares_it() -> None:
    routes = {route.op: route for route in ROUTES}
    for declared in api.MEMORY_OPERATIONS:
        route = routes[declared.op]
        assert (route.method, route.path) == (declared.method, declared.path), declared.op
        assert route.summary.startswith(declared.summary), declared.op
        assert (route.response and route.response.__name__) == declared.response, declared.op
        assert (route.request and route.request.__name__) == declared.request, declared.op
        by_name = {param.name: param for param in route.declared_params}
        for param in declared.params:
            assert dict(by_name[param.name].schema) == dict(param.schema), (declared.op, param.name)
            assert by_name[param.name].description == param.description, (declared.op, param.name)


def test_the_launcher_routes_and_documents_each_operation_as_the_contract_declares_it() -> None:
    routes = {route.op: route for route in launcher_openapi.ROUTES}
    assert set(routes) == {declared.op for declared in api.MEMORY_OPERATIONS}
    for declared in api.MEMORY_OPERATIONS:
        route = routes[declared.op]
        assert (route.method, route.path) == (declared.method, declared.path), declared.op
        assert all(param in route.params for param in declared.params), declared.op
        path = declared.path.replace(api.CONVERSATION_ID_TEMPLATE, "c1")
        assert api.memory_route(declared.method, path) == (declared.op, "c1" if declared.on_conversation else None)
        assert api.memory_target(declared.op, "c1" if declared.on_conversation else None) == (declared.method, path)


def test_both_documents_describe_a_shared_operation_alike() -> None:
    proxy, launcher = proxy_document(), launcher_openapi.build()
    for declared in api.MEMORY_OPERATIONS:
        ours = proxy["paths"][declared.path][declared.method.lower()]
        theirs = launcher["paths"][declared.path][declared.method.lower()]
        assert ours["responses"]["200"] == theirs["responses"]["200"], declared.op
        assert ours.get("requestBody") == theirs.get("requestBody"), declared.op
        shared = {p.name for p in declared.params} | ({"conversationId"} if declared.on_conversation else set())
        assert [p for p in ours["parameters"] if p["name"] in shared] == [
            p for p in theirs["parameters"] if p["name"] in shared
        ], declared.op
