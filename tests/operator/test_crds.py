"""The CRDs: generated from the contract, complete (a description on every field), and committed as
generated."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sessionmem_core import api, env, kube
from sessionmem_operator import crds, spec
from sessionmem_proxy.redaction import BUILTIN

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("file_name", sorted(crds.CRD_FILES))
def test_committed_crd_matches_generator(file_name: str) -> None:
    committed = (REPO / "charts" / "sessionmem" / "crds" / file_name).read_text(encoding="utf-8")
    assert committed == crds.render_yaml(crds.CRD_FILES[file_name]()), f"{file_name} is stale: run `make crds`"


def _walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, prop in (schema.get("properties") or {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")


@pytest.mark.parametrize("build", [crds.agent_deployment_crd, crds.agent_registry_crd])
def test_every_field_has_a_description(build: Any) -> None:
    schema = build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # metadata is the one exception: the API server forbids anything but its type.
    missing = [path for path, node in _walk(schema, "") if path != ".metadata" and not node.get("description")]
    assert missing == []


def _agent_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crds.agent_deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_agent_deployment_names_scope_and_subresources() -> None:
    crd = crds.agent_deployment_crd()
    assert crd["metadata"]["name"] == f"{kube.AGENT_PLURAL}.{kube.GROUP}"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == kube.AGENT_KIND
    assert crd["spec"]["names"]["shortNames"] == ["agd"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == kube.VERSION
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Scope"] == ".status.scope"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_agent_registry_is_cluster_scoped() -> None:
    crd = crds.agent_registry_crd()
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["shortNames"] == ["agreg"]
    columns = {c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Members", "Age"} <= columns


def test_defaults_and_bounds_come_from_the_contract() -> None:
    memory = _agent_schema()["properties"]["spec"]["properties"]["sessionMemory"]["properties"]
    assert memory["scope"]["enum"] == ["session", "shared"]
    assert memory["scope"]["default"] == "session"
    assert memory["perUser"]["default"] is False
    assert memory["replayMessages"]["default"] == env.DEFAULT_REPLAY_MESSAGES
    assert memory["maxEntries"]["default"] == env.DEFAULT_CAP
    assert memory["maxEntries"]["maximum"] == env.MAX_CAP
    assert memory["ttl"]["default"] == "24h"
    assert "default" not in memory["replayTokens"]


def test_root_rule_limits_the_name_for_knative_revisions() -> None:
    rules = _agent_schema()["x-kubernetes-validations"]
    assert any(
        r["rule"] == f"size(self.metadata.name) <= {kube.MAX_AGENT_NAME}" and "metadata.name" in r["message"]
        for r in rules
    )


def test_apply_defaults_matches_the_design_manifest_expectations() -> None:
    manifest = yaml.safe_load((REPO / "examples" / "support-agent.yaml").read_text(encoding="utf-8"))
    defaulted = crds.apply_defaults(_agent_schema(), manifest)
    assert defaulted["spec"]["sessionMemory"] == {
        "scope": "session",
        "perUser": False,
        "replayMessages": 40,
        "tokenCounter": "approx",
        "maxEntries": 500,
        "ttl": "24h",
    }
    # No sessionMemory stays no sessionMemory: defaulting never switches memory on.
    bare = crds.apply_defaults(_agent_schema(), {"spec": {"image": "x"}})
    assert bare["spec"] == {"image": "x", "executionModel": "serving"}


def _memory_schema() -> dict[str, Any]:
    memory: dict[str, Any] = _agent_schema()["properties"]["spec"]["properties"]["sessionMemory"]
    return memory


def test_memory_policy_fields_defaults_and_bounds() -> None:
    memory = _memory_schema()["properties"]
    redact = memory["redact"]
    assert redact["items"]["pattern"] == "^[a-z][a-z0-9-]{0,31}$"
    assert redact["maxItems"] == 16
    assert redact["x-kubernetes-list-type"] == "set"  # duplicates are refused by the API server
    assert "default" not in redact
    summary = memory["summary"]["properties"]
    assert "default" not in memory["summary"]  # absent = off, never switched on by defaulting
    assert "default" not in summary["threshold"]
    assert summary["threshold"]["minimum"] == 2
    assert summary["threshold"]["maximum"] == env.MAX_CAP  # what LauncherSettings accepts
    assert summary["endpoint"]["default"] == "builtin"
    assert memory["tokenCounter"]["default"] == "approx"
    assert memory["tokenCounter"]["pattern"] == r"^(approx|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"


def test_policy_defaults_are_the_launchers_and_the_proxys() -> None:
    defaults = {f.name: f.default for f in env.LauncherSettings.__dataclass_fields__.values()}
    assert defaults["token_counter"] == spec.DEFAULT_TOKEN_COUNTER
    assert defaults["summarizer_url"] == spec.BUILTIN_SUMMARIZER
    assert set(api.BUILTIN_REDACTORS) == set(BUILTIN)  # one list of names, which the proxy implements
    pattern = re.compile(_memory_schema()["properties"]["redact"]["items"]["pattern"])
    assert all(pattern.match(name) for name in BUILTIN)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("builtin", True),
        ("http://127.0.0.1:8081/summarize", True),
        ("https://summarizer.team.svc/v1?x=1", True),
        ("http://localhost:8081", True),
        ("ftp://host/x", False),
        ("http://", False),
        ("http://user:secret@host/x", False),
        ("http://host/with space", False),
        ("Builtin", False),
        ("", False),
    ],
)
def test_summary_endpoint_pattern(value: str, ok: bool) -> None:
    pattern = _memory_schema()["properties"]["summary"]["properties"]["endpoint"]["pattern"]
    assert bool(re.match(pattern, value)) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("approx", True),
        ("tiktoken_count:count", True),
        ("my_pkg.tokens:count_tokens", True),
        ("approx:x", True),
        ("my_pkg.tokens", False),
        ("my-pkg:count", False),
        ("pkg:1count", False),
        (":count", False),
        ("", False),
    ],
)
def test_token_counter_pattern(value: str, ok: bool) -> None:
    pattern = _memory_schema()["properties"]["tokenCounter"]["pattern"]
    assert bool(re.match(pattern, value)) is ok


def test_summary_rules_name_the_field() -> None:
    rules = {r["fieldPath"]: r for r in _memory_schema()["x-kubernetes-validations"] if "summary" in r["rule"]}
    assert set(rules) == {".summary", ".summary.threshold"}
    messages = [r["message"] for r in _memory_schema()["x-kubernetes-validations"] if "summary" in r["rule"]]
    assert any("summary.threshold must be greater than spec.sessionMemory.replayMessages" in m for m in messages)
    assert any("summary.threshold must be less than spec.sessionMemory.maxEntries" in m for m in messages)
    assert any("summary applies to session scope only" in m for m in messages)
