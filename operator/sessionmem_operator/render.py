"""AgentDeployment -> the manifests the operator applies. Pure: no API calls, no clock, no randomness, so
the same spec always renders the same objects and re-applying them is a no-op.

Everything is owned by the AgentDeployment (controller owner reference), so deleting it lets the garbage
collector remove the lot: the operator needs no finalizer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from sessionmem_core import kube
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.security import agent_security_context
from sessionmem_operator.spec import AgentSpec, ExecutionModel
from sessionmem_operator.wiring import (
    SERVE_PORT_NAME,
    MemoryResolution,
    agent_memory_env,
    launcher_container,
    token_volume,
    wiring_hash,
)

KNATIVE_API_VERSION = "serving.knative.dev/v1"
AGENT_CONTAINER = "agent"
WIRING_ANNOTATION = f"{kube.GROUP}/memory-wiring"
SERVICE_PORT = 80
# The usual "listen on $PORT" contract: Knative sets it for the serving container, we set it everywhere else.
PORT_ENV = "PORT"

Manifest = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str


SERVICE_ACCOUNT_KIND = ("v1", "ServiceAccount")
KNATIVE_SERVICE_KIND = (KNATIVE_API_VERSION, "Service")
DEPLOYMENT_KIND = ("apps/v1", "Deployment")
SERVICE_KIND = ("v1", "Service")


@dataclass(frozen=True, slots=True)
class Rendered:
    objects: tuple[Manifest, ...]  # apply order: the ServiceAccount before the pods that use it
    workload: ObjectRef
    stale: tuple[ObjectRef, ...]  # what the other execution model would have made: removed if present
    wiring_hash: str | None


def labels(agent: AgentSpec) -> dict[str, str]:
    return {kube.LABEL_MANAGED_BY: kube.MANAGED_BY, kube.LABEL_AGENT: agent.name}


def owner_reference(agent: AgentSpec) -> dict[str, Any]:
    return {
        "apiVersion": kube.API_VERSION,
        "kind": kube.AGENT_KIND,
        "name": agent.name,
        "uid": agent.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(agent: AgentSpec, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": agent.namespace,
        "labels": labels(agent),
        "ownerReferences": [owner_reference(agent)],
    }


def service_account(agent: AgentSpec) -> Manifest:
    """The agent's identity towards the proxy (TokenReview maps it back to the agent). No RBAC is bound to
    it and the API token is not auto-mounted: the only token in the pod is the audience-bound one."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(agent, kube.agent_service_account(agent.name)),
        "automountServiceAccountToken": False,
    }


def agent_container(agent: AgentSpec, *, set_port_env: bool) -> dict[str, Any]:
    variables = [{"name": name, "value": value} for name, value in agent.env]
    container: dict[str, Any] = {
        "name": AGENT_CONTAINER,
        "image": agent.image,
        "securityContext": agent_security_context(agent.security_context),
    }
    if agent.memory is not None:
        # Behind the launcher the agent is a sidecar: Knative gives it no $PORT but lets us set one, so an
        # agent following the usual "listen on $PORT" contract works unchanged.
        variables += [*agent_memory_env(agent), {"name": PORT_ENV, "value": str(agent.agent_port)}]
    else:
        container["ports"] = [{"name": SERVE_PORT_NAME, "containerPort": agent.agent_port, "protocol": "TCP"}]
        if set_port_env:
            variables.append({"name": PORT_ENV, "value": str(agent.agent_port)})
    if variables:
        container["env"] = variables
    if agent.env_from:
        container["envFrom"] = [copy.deepcopy(dict(item)) for item in agent.env_from]
    if agent.resources:
        container["resources"] = copy.deepcopy(dict(agent.resources))
    return container


def pod_template(agent: AgentSpec, resolution: MemoryResolution, config: OperatorConfig) -> tuple[Manifest, str | None]:
    """The pod template and its wiring hash (None without memory)."""
    set_port_env = agent.execution_model is ExecutionModel.DEPLOYMENT
    containers = [agent_container(agent, set_port_env=set_port_env)]
    volumes: list[dict[str, Any]] = []
    annotations: dict[str, str] = {}
    digest: str | None = None
    sa_name = kube.agent_service_account(agent.name)
    if resolution.enabled:
        launcher = launcher_container(agent, resolution, config)
        volumes.append(token_volume(config))
        # The launcher comes first: it owns the serving port, and Knative routes to the container with a port.
        containers.insert(0, launcher)
        digest = wiring_hash(launcher, volumes, sa_name)
        annotations[WIRING_ANNOTATION] = digest
    spec: dict[str, Any] = {"serviceAccountName": sa_name, "containers": containers}
    if volumes:
        spec["volumes"] = volumes
    if agent.image_pull_secrets:
        spec["imagePullSecrets"] = [copy.deepcopy(dict(item)) for item in agent.image_pull_secrets]
    if agent.node_selector:
        spec["nodeSelector"] = dict(agent.node_selector)
    if agent.tolerations:
        spec["tolerations"] = [copy.deepcopy(dict(item)) for item in agent.tolerations]
    metadata: dict[str, Any] = {"labels": labels(agent)}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": spec}, digest


def knative_service(agent: AgentSpec, template: Manifest) -> Manifest:
    return {
        "apiVersion": KNATIVE_API_VERSION,
        "kind": "Service",
        "metadata": _metadata(agent, agent.name),
        "spec": {"template": template},
    }


def deployment(agent: AgentSpec, template: Manifest) -> Manifest:
    # No replicas: `kubectl scale` (or an HPA) keeps working; the API server defaults a new one to 1.
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(agent, agent.name),
        "spec": {"selector": {"matchLabels": labels(agent)}, "template": template},
    }


def service(agent: AgentSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(agent, agent.name),
        "spec": {
            "selector": labels(agent),
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": SERVE_PORT_NAME, "protocol": "TCP"}],
        },
    }


def _ref(kind: tuple[str, str], name: str) -> ObjectRef:
    return ObjectRef(api_version=kind[0], kind=kind[1], name=name)


def render(agent: AgentSpec, resolution: MemoryResolution, config: OperatorConfig) -> Rendered:
    template, digest = pod_template(agent, resolution, config)
    account = service_account(agent)
    if agent.execution_model is ExecutionModel.SERVING:
        return Rendered(
            objects=(account, knative_service(agent, template)),
            workload=_ref(KNATIVE_SERVICE_KIND, agent.name),
            stale=(_ref(DEPLOYMENT_KIND, agent.name), _ref(SERVICE_KIND, agent.name)),
            wiring_hash=digest,
        )
    return Rendered(
        objects=(account, deployment(agent, template), service(agent)),
        workload=_ref(DEPLOYMENT_KIND, agent.name),
        stale=(_ref(KNATIVE_SERVICE_KIND, agent.name),),
        wiring_hash=digest,
    )
