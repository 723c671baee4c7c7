"""The Helm chart against a real kube-apiserver (tests/harness): `helm install` is accepted object by
object, and the components run the way the chart configures them.

The end-to-end test takes everything from what helm installed: the operator's env, config file and
ServiceAccount (logged in with a token of that ServiceAccount, so the chart's RBAC is what it gets), the
seed AgentDeployment of DESIGN.md, then the proxy with its env, Secret and ServiceAccount in front of a
valkey-server running the chart's valkey.conf and ACL, reached with the agent's own token. Only the
things a pod has and a test machine does not are substituted (service DNS names, ports, the in-cluster
API credentials); every wait is a bounded poll.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from sessionmem_core import env, kube
from sessionmem_operator.config import OperatorConfig
from tests.chart.test_lint import (
    CHART,
    EXAMPLE,
    PRODUCTION,
    ChartValkey,
    Doc,
    containers,
    env_list,
    find,
    free_port,
    parse_docs,
    plain_env,
    resolved_env,
    run_helm,
)
from tests.harness import KubeApiError, KubeTestCluster
from tests.harness.fixtures import namespace_name_for
from tests.support.kube_tokens import agent_pod_token
from tests.support.polling import poll
from tests.support.processes import ServiceProcess

pytestmark = pytest.mark.integration

WAIT_SECONDS = 30.0
KSVC = "serving.knative.dev/v1"
IMAGE_REPOSITORY = "registry.test/sessionmem"

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = WAIT_SECONDS) -> T:
    return poll(probe, what, timeout)


class Release:
    """One `helm install` into the test API server; uninstalled (cluster-scoped objects too) on close."""

    def __init__(self, cluster: KubeTestCluster, namespace: str, *args: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = f"sm{namespace[-6:]}"  # unique per test: ClusterRoles are named after the release
        self.kubeconfig = ["--kubeconfig", str(cluster.kubeconfig_path), "--namespace", namespace]
        # The CRDs are cluster-scoped and the harness installed them already, from the chart's own crds/.
        run_helm("install", self.name, str(CHART), *self.kubeconfig, "--skip-crds", *args)
        self.docs = parse_docs(run_helm("get", "manifest", self.name, *self.kubeconfig).stdout)
        base = f"{self.name}-sessionmem"
        self.operator, self.proxy, self.valkey = f"{base}-operator", f"{base}-proxy", f"{base}-valkey"

    def uninstall(self) -> None:
        run_helm("uninstall", self.name, *self.kubeconfig, "--wait=hookOnly", check=False)

    def live(self, doc: Doc) -> Doc | None:
        meta = doc["metadata"]
        return self.cluster.rest.get(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace"))

    def secret_value(self, name: str, key: str) -> str:
        secret = self.cluster.rest.get("v1", "Secret", name, self.namespace)
        assert secret is not None, name
        return base64.b64decode(secret["data"][key]).decode()


@contextlib.contextmanager
def installed(cluster: KubeTestCluster, namespace: str, *args: str) -> Iterator[Release]:
    release = Release(cluster, namespace, *args)
    try:
        yield release
    finally:
        release.uninstall()


@pytest.mark.parametrize("profile", ["default", "production"])
def test_every_chart_object_is_accepted(kube_cluster: KubeTestCluster, kube_namespace: str, profile: str) -> None:
    args = ("-f", str(PRODUCTION)) if profile == "production" else ()
    with installed(kube_cluster, kube_namespace, *args) as release:
        kinds = {doc["kind"] for doc in release.docs}
        assert {"Deployment", "StatefulSet", "PodDisruptionBudget", "NetworkPolicy", "ClusterRole"} <= kinds
        for doc in release.docs:
            live = release.live(doc)
            assert live is not None, f"{doc['kind']} {doc['metadata']['name']} was not stored"
            if doc["kind"] in ("Deployment", "StatefulSet"):
                assert (
                    live["spec"]["template"]["spec"]["containers"][0]["image"]
                    == (doc["spec"]["template"]["spec"]["containers"][0]["image"])
                )
        # The `helm test` hook pod is not installed: the server validates it with a dry run (no nodes here
        # to run it on).
        hooks = parse_docs(run_helm("get", "hooks", release.name, *release.kubeconfig).stdout)
        (pod,) = [h for h in hooks if h["kind"] == "Pod"]
        path = f"/api/v1/namespaces/{kube_namespace}/pods?dryRun=All&fieldValidation=Strict"
        created = kube_cluster.rest.request("POST", path, body=pod).json()
        assert created["metadata"]["name"] == pod["metadata"]["name"]
        # The generated Valkey password is kept by an upgrade (lookup), not regenerated.
        before = release.secret_value(f"{release.valkey}-auth", "password")
        run_helm("upgrade", release.name, str(CHART), *release.kubeconfig, "--skip-crds", *args)
        assert release.secret_value(f"{release.valkey}-auth", "password") == before


def _operator_proxy_url(release: Release) -> str | None:
    deployment = release.cluster.rest.get("apps/v1", "Deployment", release.operator, release.namespace)
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}.get(env.OPERATOR_PROXY_URL)


@pytest.mark.parametrize("reuse", [False, True], ids=["values-given", "reuse-values"])
def test_one_upgrade_turns_memory_off_and_one_turns_it_back_on(
    kube_cluster: KubeTestCluster, kube_namespace: str, reuse: bool
) -> None:
    """operator.proxyUrl none -> "" (this release's proxy) in one helm upgrade, also with --reuse-values
    (where Helm kept a --set key=null for one upgrade too long, when null was the default)."""
    with installed(kube_cluster, kube_namespace) as release:
        own = f"http://{release.proxy}.{kube_namespace}.svc.cluster.local:8000"
        assert _operator_proxy_url(release) == own
        reused = ("--reuse-values",) if reuse else ()
        upgrade = ("upgrade", release.name, str(CHART), *release.kubeconfig, "--skip-crds", *reused)
        run_helm(*upgrade, "--set", "operator.proxyUrl=none")
        assert not _operator_proxy_url(release), "no proxy: memory is off"
        run_helm(*upgrade, "--set", "operator.proxyUrl=")
        assert _operator_proxy_url(release) == own


class Operator:
    """`python -m sessionmem_operator` as the chart's Deployment runs it."""

    def __init__(self, release: Release, workdir: Path) -> None:
        deployment = find(release.docs, "Deployment", release.operator)
        (container,) = containers(deployment)
        spec = deployment["spec"]["template"]["spec"]
        self.variables = plain_env(container)
        # All literal values but its own namespace, which the pod supplies (here: the release's).
        from_pod = [e for e in env_list(container) if "value" not in e]
        assert [e["name"] for e in from_pod] == [env.OPERATOR_NAMESPACE], from_pod
        self.variables[env.OPERATOR_NAMESPACE] = release.namespace

        # Its config file is the chart's ConfigMap; only the liveness port moves to a free one, and the
        # proxy's health is not probed: its Service's name resolves only inside a cluster (the probe, with
        # the chart's period, is tests/operator/test_memory_health.py's, against a real proxy).
        config_path = Path(self.variables[env.OPERATOR_CONFIG_FILE])
        config_map = find(release.docs, "ConfigMap", release.operator)
        config = yaml.safe_load(config_map["data"][config_path.name])
        assert config["memoryHealthSeconds"] == 10
        config["memoryHealthSeconds"] = 0
        self.health_port = free_port()
        config["livenessEndpoint"] = re.sub(r":\d+/", f":{self.health_port}/", config["livenessEndpoint"])
        local_config = workdir / config_path.name
        local_config.write_text(yaml.safe_dump(config), encoding="utf-8")

        # Logged in as the chart's ServiceAccount: a token of it in a kubeconfig (in a pod: the mounted one).
        cluster = release.cluster
        account = spec["serviceAccountName"]
        self.identity = f"system:serviceaccount:{release.namespace}:{account}"
        token = cluster.mint_service_account_token(release.namespace, account, cluster.issuer, 3600)
        kubeconfig = cluster.write_kubeconfig(workdir / "operator.kubeconfig", token=token, user=account)
        base = {k: v for k, v in cluster.kubeconfig_env().items() if not k.startswith("SESSIONMEM_")}
        self.env = {
            **base,
            **self.variables,
            env.OPERATOR_CONFIG_FILE: str(local_config),
            "KUBECONFIG": str(kubeconfig),
        }
        command = list(container["command"])
        assert command[:3] == ["python", "-m", "sessionmem_operator"], command
        self.argv = [sys.executable, *command[1:]]
        self.log_path = workdir / "operator.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the operator exited:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1).status_code == 200
            return False

        wait_for(healthy, "the operator's /healthz")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-6000:]

    def rbac_denials(self) -> list[str]:
        """Log lines where the API server refused the operator's own identity, or kopf lacked a verb.

        Matched on the identity, not on the word "forbidden": the API server's cluster is shared by the
        session, and a cluster-wide operator also meets other tests' terminating namespaces, which
        refuse new objects with a 403 that says nothing about the chart's RBAC.
        """
        denied = re.compile(
            rf'User \\?"{re.escape(self.identity)}\\?" cannot|(?i:not enough permissions|permission denied)'
        )
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return [line for line in lines if denied.search(line)]

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


def _condition(body: Doc | None, kind: str) -> Doc | None:
    for condition in ((body or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            found: Doc = condition
            return found
    return None


def _proxy_process(release: Release, valkey: ChartValkey, workdir: Path) -> ServiceProcess:
    """The proxy with the env of the chart's Deployment; its Secret-backed values from the installed Secret."""
    deployment = find(release.docs, "Deployment", release.proxy)
    (container,) = containers(deployment)
    secrets = {}
    for var in env_list(container):
        if "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            secrets[var["name"]] = release.secret_value(ref["name"], ref["key"])
    variables = {k: v for k, v in resolved_env(container, secrets).items() if k != "VALKEY_PASSWORD"}
    assert variables[env.AUTH_MODE] == "tokenreview"
    # The Service DNS name of Valkey becomes the local server; the rest of the URL (user, password, db) stays.
    url = variables[env.VALKEY_URL]
    host = f"{release.valkey}.{release.namespace}.svc.cluster.local:6379"
    assert host in url, url
    variables[env.VALKEY_URL] = url.replace(host, f"127.0.0.1:{valkey.port}")
    # In a pod the in-cluster configuration supplies these; here a token of the proxy's ServiceAccount.
    cluster = release.cluster
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token_file = workdir / "proxy-token"
    token_file.write_text(cluster.mint_service_account_token(release.namespace, account, cluster.issuer, 3600))
    port = free_port()
    variables.update(
        {
            env.PROXY_HOST: "127.0.0.1",
            env.PROXY_PORT: str(port),
            env.KUBE_API_SERVER: cluster.server_url,
            env.KUBE_CA_FILE: str(cluster.ca_path),
            env.KUBE_TOKEN_FILE: str(token_file),
        }
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONMEM_", "KUBERNETES_"))}
    proxy = ServiceProcess("sessionmem_proxy", {**clean, **variables}, port, health_path="/readyz")
    proxy.env = {**clean, **variables}  # exactly this environment, nothing inherited on top
    return proxy


@pytest.mark.parametrize("scope", ["cluster-wide", "watch-namespaces"])
def test_chart_wires_operator_proxy_and_valkey(
    kube_cluster: KubeTestCluster, kube_namespace: str, tmp_path: Path, scope: str
) -> None:
    tag = f"it-{kube_namespace[-6:]}"
    audience = f"sessionmem-{kube_namespace[-6:]}"
    agents = kube_cluster.create_namespace(namespace_name_for("chart-agents"))
    values = [
        f"image.repository={IMAGE_REPOSITORY}",
        f"image.tag={tag}",
        f"proxy.audience={audience}",
        "operator.tokenExpirationSeconds=900",
    ]
    if scope == "watch-namespaces":
        # The operator's namespaced rights become a Role in the agents' namespace only.
        values.append(f"operator.watchNamespaces={{{agents}}}")
    operator: Operator | None = None
    try:
        with installed(kube_cluster, kube_namespace, *[a for v in values for a in ("--set", v)]) as release:
            if scope == "watch-namespaces":
                assert kube_cluster.rest.get("rbac.authorization.k8s.io/v1", "Role", release.operator, agents)
            operator = Operator(release, tmp_path)
            chart_image = f"{IMAGE_REPOSITORY}:{tag}"
            proxy_url = f"http://{release.proxy}.{kube_namespace}.svc.cluster.local:8000"
            assert OperatorConfig.load(operator.env).proxy_url == proxy_url
            operator.start()

            # The DESIGN.md seed manifest, in a namespace of its own.
            seed: Doc = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
            seed["metadata"]["namespace"] = agents
            kube_cluster.apply_manifests([seed])
            name = seed["metadata"]["name"]

            ksvc = wait_for(lambda: kube_cluster.rest.get(KSVC, "Service", name, agents), "the Knative Service")
            pod = ksvc["spec"]["template"]["spec"]
            launcher = pod["containers"][0]
            assert launcher["name"] == "sessionmem-launcher"
            assert launcher["image"] == chart_image == operator.variables[env.OPERATOR_LAUNCHER_IMAGE]
            assert launcher["command"] == ["python", "-m", "sessionmem_launcher"]
            launcher_env = plain_env(launcher)
            assert launcher_env[env.PROXY_URL] == proxy_url
            service = find(release.docs, "Service", release.proxy)
            assert proxy_url.endswith(f"{service['metadata']['name']}.{kube_namespace}.svc.cluster.local:8000")
            assert service["spec"]["ports"][0]["port"] == 8000
            (volume,) = [v for v in pod["volumes"] if "projected" in v]
            token_source = volume["projected"]["sources"][0]["serviceAccountToken"]
            assert token_source["audience"] == audience
            assert token_source["expirationSeconds"] == 900
            assert pod["containers"][1]["image"] == seed["spec"]["image"]

            # Status written under the chart's RBAC (agentdeployments/status).
            memory = wait_for(
                lambda: _condition(
                    kube_cluster.rest.get(kube.API_VERSION, kube.AGENT_KIND, name, agents), "MemoryReady"
                ),
                "MemoryReady on the AgentDeployment",
            )
            assert memory["status"] == "True", memory
            account = pod["serviceAccountName"]
            assert kube_cluster.rest.get("v1", "ServiceAccount", account, agents) is not None

            # The proxy and Valkey as the chart configures them, reached with the agent's own token.
            docs = release.docs
            config_map = find(docs, "ConfigMap", release.valkey)
            statefulset = find(docs, "StatefulSet", release.valkey)
            user = plain_env(containers(statefulset)[-1])["VALKEY_USER"]
            password = release.secret_value(f"{release.valkey}-auth", "password")
            (tmp_path / "valkey").mkdir()
            valkey = ChartValkey(tmp_path / "valkey", config_map, password, user)
            valkey.start()
            proxy = _proxy_process(release, valkey, tmp_path)
            try:
                proxy.start()
                # A token bound to a pod of the agent, as the kubelet projects it (the proxy refuses others).
                agent_token = agent_pod_token(kube_cluster, agents, account, audience)
                wrong_audience = agent_pod_token(kube_cluster, agents, account, "sessionmem-proxy")
                headers = {"Authorization": f"Bearer {agent_token}"}
                with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
                    body = {"entries": [{"role": "user", "content": "hello from the seed agent"}]}
                    appended = client.post("/v1/conversations/c-1/entries", json=body, headers=headers)
                    assert appended.status_code == 200, appended.text
                    read = client.get("/v1/conversations/c-1/entries", headers=headers).json()
                    assert [(e["content"], e["author"]) for e in read["entries"]] == [
                        ("hello from the seed agent", f"{agents}/{name}")
                    ]
                    refused = client.get(
                        "/v1/conversations/c-1/entries", headers={"Authorization": f"Bearer {wrong_audience}"}
                    )
                    assert refused.status_code == 401
            finally:
                proxy.stop()
                valkey.stop()

            assert operator.rbac_denials() == [], operator.log()
    finally:
        if operator is not None:
            operator.stop()
        with contextlib.suppress(KubeApiError):
            kube_cluster.delete_namespace(agents)


def test_proxy_service_account_has_exactly_what_it_needs(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    with installed(kube_cluster, kube_namespace) as release:
        token = kube_cluster.mint_service_account_token(kube_namespace, release.proxy, kube_cluster.issuer, 600)
        with httpx.Client(
            base_url=kube_cluster.server_url,
            verify=ssl.create_default_context(cafile=str(kube_cluster.ca_path)),
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        ) as api:

            def status(method: str, path: str, body: Any = None) -> int:
                return api.request(method, path, json=body).status_code

            review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "x"}}
            assert status("POST", "/apis/authentication.k8s.io/v1/tokenreviews", review) == 201
            assert status("GET", f"/apis/{kube.API_VERSION}/{kube.REGISTRY_PLURAL}") == 200
            registry = {"apiVersion": kube.API_VERSION, "kind": kube.REGISTRY_KIND, "metadata": {"name": "x"}}
            assert status("POST", f"/apis/{kube.API_VERSION}/{kube.REGISTRY_PLURAL}", registry) == 403
            assert status("GET", "/api/v1/secrets") == 403
            assert status("GET", f"/api/v1/namespaces/{kube_namespace}/secrets") == 403
            # AgentDeployments: read (their spec.sessionMemory.quota), never written.
            agents = f"/apis/{kube.API_VERSION}/namespaces/{kube_namespace}/{kube.AGENT_PLURAL}"
            assert status("GET", agents) == 200
            assert status("GET", f"/apis/{kube.API_VERSION}/{kube.AGENT_PLURAL}?watch=true&timeoutSeconds=1") == 200
            agent_doc = {"apiVersion": kube.API_VERSION, "kind": kube.AGENT_KIND, "metadata": {"name": "x"}}
            assert status("POST", agents, {**agent_doc, "spec": {"image": "x"}}) == 403
            assert status("PATCH", f"{agents}/x/status", {}) == 403
