"""Reconcile orchestration against an in-memory API (no server): what is applied, deleted, patched and
warned about, and that a second run changes nothing."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import pytest

from sessionmem_core import kube
from sessionmem_operator import kubeapi
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.kubeapi import Kind, KubeApi, KubeError
from sessionmem_operator.reconcile import (
    ReconcileError,
    Runtime,
    reconcile_agent,
    registry_changed,
    resync_all,
    workload_changed,
)
from tests.operator.test_render import UID, as_stored, design_manifest

LOG = logging.getLogger("test")
CONFIG = OperatorConfig(proxy_url="http://proxy:8000")
Key = tuple[str, str, str | None, str]


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeKube:
    """Just enough of the API server: apply replaces what it renders (as a forced apply of full objects
    does), bumps generation on spec changes, and status is a separate subresource."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.applied: list[Key] = []
        self.deleted: list[Key] = []
        self.status_patches: list[tuple[Key, dict[str, Any]]] = []
        self.fail_apply: dict[str, KubeError] = {}
        self.after_apply: Callable[[Key], None] | None = None
        self._uids = 0

    @staticmethod
    def key(kind: Kind, namespace: str | None, name: str) -> Key:
        return (kind.api_version, kind.kind, namespace, name)

    def put(self, body: dict[str, Any]) -> dict[str, Any]:
        kind = kubeapi.kind_of(body["apiVersion"], body["kind"])
        meta = body["metadata"]
        self.objects[self.key(kind, meta.get("namespace"), meta["name"])] = body
        return body

    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        found = self.objects.get(self.key(kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def apply(self, manifest: Mapping[str, Any], *, uid: str | None) -> dict[str, Any]:
        if manifest["kind"] in self.fail_apply:
            raise self.fail_apply[manifest["kind"]]
        kind = kubeapi.kind_of(manifest["apiVersion"], manifest["kind"])
        meta = manifest["metadata"]
        key = self.key(kind, meta.get("namespace"), meta["name"])
        old = self.objects.get(key)
        if old is not None and uid is None:
            # A create (POST) of a name taken meanwhile.
            raise KubeError("POST", "/x", 409, '{"reason": "AlreadyExists", "message": "already exists"}')
        if uid is not None and (old is None or old["metadata"]["uid"] != uid):
            # An apply pinned to an incarnation that is gone or replaced: uid is immutable.
            raise KubeError("PATCH", "/x", 422, '{"reason": "Invalid", "message": "metadata.uid: immutable"}')
        self.applied.append(key)
        body = copy.deepcopy(dict(manifest))
        if old is None:
            self._uids += 1
            body["metadata"] = {**body["metadata"], "uid": f"uid-{self._uids}", "generation": 1}
        else:
            changed = {k: v for k, v in body.items() if k not in ("metadata", "status")} != {
                k: v for k, v in old.items() if k not in ("metadata", "status")
            }
            generation = old["metadata"]["generation"] + (1 if changed else 0)
            body["metadata"] = {**body["metadata"], "uid": old["metadata"]["uid"], "generation": generation}
            if "status" in old:
                body["status"] = old["status"]
        self.objects[key] = body
        if self.after_apply is not None:
            self.after_apply(key)
        return copy.deepcopy(body)

    async def delete(self, kind: Kind, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        key = self.key(kind, namespace, name)
        found = self.objects.get(key)
        if found is None or (uid is not None and found["metadata"]["uid"] != uid):
            return False
        del self.objects[key]
        self.deleted.append(key)
        return True

    async def patch_status(
        self, kind: Kind, namespace: str | None, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        key = self.key(kind, namespace, name)
        if key not in self.objects:
            raise KubeError("PATCH", "/x", 404, '{"reason": "NotFound", "message": "not found"}')
        self.status_patches.append((key, dict(status)))
        body = self.objects[key]
        body.setdefault("status", {})
        _merge(body["status"], status)
        return copy.deepcopy(body)

    async def list_names(self, kind: Kind, namespace: str | None) -> list[tuple[str, str]]:
        return sorted(
            (str(ns), name)
            for (api_version, kind_name, ns, name) in self.objects
            if (api_version, kind_name) == (kind.api_version, kind.kind) and namespace in (None, ns)
        )

    async def close(self) -> None:
        return None


class Warnings:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def __call__(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        self.posted.append((body["metadata"]["name"], reason, message))


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


@pytest.fixture
def warnings() -> Warnings:
    return Warnings()


@pytest.fixture
def runtime(fake: FakeKube, warnings: Warnings) -> Runtime:
    return Runtime(config=CONFIG, kube=cast(KubeApi, fake), post_warning=warnings)


AGENT_KEY: Key = (kube.API_VERSION, kube.AGENT_KIND, "my-team", "support-agent")
KSVC_KEY: Key = ("serving.knative.dev/v1", "Service", "my-team", "support-agent")
DEPLOY_KEY: Key = ("apps/v1", "Deployment", "my-team", "support-agent")
SERVICE_KEY: Key = ("v1", "Service", "my-team", "support-agent")
SA_KEY: Key = ("v1", "ServiceAccount", "my-team", "sessionmem-support-agent")


def stored_agent(fake: FakeKube, mutate: Any = None, generation: int = 1) -> dict[str, Any]:
    manifest = design_manifest()
    if mutate is not None:
        mutate(manifest["spec"])
    body = as_stored(manifest, generation)
    body["apiVersion"], body["kind"] = kube.API_VERSION, kube.AGENT_KIND
    old = fake.objects.get(AGENT_KEY)
    if old is not None and "status" in old:
        body["status"] = old["status"]
    return fake.put(body)


def condition(fake: FakeKube, type_: str) -> dict[str, Any]:
    conditions = fake.objects[AGENT_KEY]["status"]["conditions"]
    found: dict[str, Any] = next(c for c in conditions if c["type"] == type_)
    return found


async def test_reconcile_applies_and_records_and_is_idempotent(runtime: Runtime, fake: FakeKube) -> None:
    stored_agent(fake)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert fake.applied == [SA_KEY, KSVC_KEY]
    status = fake.objects[AGENT_KEY]["status"]
    assert status["observedGeneration"] == 1
    assert status["scope"] == "session"
    assert status["keyPrefix"] == "mem:my-team/support-agent:"
    assert condition(fake, "MemoryReady")["status"] == "True"
    assert condition(fake, "Ready")["status"] == "Unknown"
    assert fake.objects[KSVC_KEY]["metadata"]["ownerReferences"][0]["uid"] == UID

    patches = len(fake.status_patches)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert len(fake.status_patches) == patches  # nothing new: no status write
    assert fake.objects[KSVC_KEY]["metadata"]["generation"] == 1  # same template: no new revision


async def test_shared_non_member_warns_once_then_joins(runtime: Runtime, fake: FakeKube, warnings: Warnings) -> None:
    def shared(spec: dict[str, Any]) -> None:
        spec["sessionMemory"]["scope"] = "shared"

    stored_agent(fake, shared)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert [(name, reason) for name, reason, _ in warnings.posted] == [("support-agent", "NotARegistryMember")]
    memory = condition(fake, "MemoryReady")
    assert (memory["status"], memory["reason"]) == ("False", "NotARegistryMember")
    assert fake.objects[AGENT_KEY]["status"]["keyPrefix"] == "mem:my-team/support-agent:"

    index = {("my-team", "support-agent"): ["support-team"]}
    await reconcile_agent(runtime, "my-team", "support-agent", index, LOG)
    status = fake.objects[AGENT_KEY]["status"]
    assert (status["scope"], status["registry"], status["keyPrefix"]) == (
        "shared",
        "support-team",
        "mem:shared:support-team:",
    )
    assert condition(fake, "MemoryReady")["status"] == "True"
    assert fake.objects[KSVC_KEY]["metadata"]["generation"] == 2  # new wiring, new revision
    assert len(warnings.posted) == 1


async def test_switching_models_removes_only_owned_leftovers(runtime: Runtime, fake: FakeKube) -> None:
    def deployment_model(spec: dict[str, Any]) -> None:
        spec["executionModel"] = "deployment"

    stored_agent(fake, deployment_model)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert {DEPLOY_KEY, SERVICE_KEY, SA_KEY} <= set(fake.objects)

    # Back to serving: our Deployment and Service go; had Knative's route Service the same name, it would
    # have stayed (see the next test).
    stored_agent(fake, None, generation=2)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert DEPLOY_KEY in fake.deleted and SERVICE_KEY in fake.deleted
    assert KSVC_KEY in fake.objects
    assert fake.objects[AGENT_KEY]["status"]["workload"]["kind"] == "Service"


async def test_a_same_named_object_someone_else_owns_is_left_alone(runtime: Runtime, fake: FakeKube) -> None:
    fake.put(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "support-agent",
                "namespace": "my-team",
                "uid": "route-svc",
                "ownerReferences": [{"apiVersion": "serving.knative.dev/v1", "kind": "Route", "controller": True}],
            },
        }
    )
    stored_agent(fake)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert SERVICE_KEY in fake.objects and SERVICE_KEY not in fake.deleted


async def test_switching_to_deployment_removes_our_knative_service_even_while_its_route_holds_the_name(
    runtime: Runtime, fake: FakeKube
) -> None:
    stored_agent(fake)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    route = {"apiVersion": "serving.knative.dev/v1", "kind": "Route", "controller": True, "uid": "route"}
    meta = {"name": "support-agent", "namespace": "my-team", "uid": "route-svc", "ownerReferences": [route]}
    fake.put({"apiVersion": "v1", "kind": "Service", "metadata": meta})

    def deployment_model(spec: dict[str, Any]) -> None:
        spec["executionModel"] = "deployment"

    stored_agent(fake, deployment_model, generation=2)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert KSVC_KEY in fake.deleted  # so the garbage collector can take the Route and its Service
    assert condition(fake, "Ready")["reason"] == "NameConflict"
    del fake.objects[SERVICE_KEY]  # what the garbage collector does next
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert {DEPLOY_KEY, SERVICE_KEY} <= set(fake.objects)
    assert fake.objects[AGENT_KEY]["status"]["workload"]["kind"] == "Deployment"


async def test_a_name_taken_by_a_foreign_object_blocks_every_write_until_it_is_free(
    runtime: Runtime, fake: FakeKube, warnings: Warnings
) -> None:
    meta = {"name": SA_KEY[3], "namespace": "my-team", "uid": "someone-elses"}
    foreign: dict[str, Any] = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    fake.put(copy.deepcopy(foreign))
    stored_agent(fake)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert fake.applied == []  # fail-closed: not even the free Knative Service
    assert fake.objects[SA_KEY] == foreign
    for type_ in ("Ready", "MemoryReady"):
        found = condition(fake, type_)
        assert (found["status"], found["reason"]) == ("False", "NameConflict")
        assert f'ServiceAccount "{SA_KEY[3]}"' in found["message"]
    assert "workload" not in fake.objects[AGENT_KEY]["status"]
    assert [(name, reason) for name, reason, _ in warnings.posted] == [("support-agent", "NameConflict")]

    del fake.objects[SA_KEY]  # the owner of the name frees it: the next reconcile (a resync) sets up the agent
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert fake.applied == [SA_KEY, KSVC_KEY]
    assert condition(fake, "MemoryReady")["reason"] == "Wired"
    assert condition(fake, "Ready")["reason"] != "NameConflict"
    assert fake.objects[AGENT_KEY]["status"]["workload"]["kind"] == "Service"


async def test_an_agent_deleted_while_it_is_reconciled_is_not_an_error(runtime: Runtime, fake: FakeKube) -> None:
    stored_agent(fake)

    def delete_the_agent(key: Key) -> None:
        if key == KSVC_KEY:
            del fake.objects[AGENT_KEY]

    fake.after_apply = delete_the_agent
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)  # nothing left to record it on
    assert fake.status_patches == []

    # Or an apply fails because the garbage collector already took a child of the agent being deleted.
    stored_agent(fake)

    def start_deleting_the_agent(key: Key) -> None:
        if key == SA_KEY:
            fake.objects[AGENT_KEY]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    fake.after_apply = start_deleting_the_agent
    fake.fail_apply["Service"] = KubeError("PATCH", "/x", 409, '{"message": "uid mismatch"}')
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert fake.status_patches == []


async def test_workload_ready_is_mirrored(runtime: Runtime, fake: FakeKube) -> None:
    stored_agent(fake)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    ksvc = fake.objects[KSVC_KEY]
    ksvc["status"] = {
        "observedGeneration": ksvc["metadata"]["generation"],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": ""}],
        "url": "http://support-agent.my-team.example.com",
        "latestCreatedRevisionName": "support-agent-00001",
    }
    await workload_changed(runtime, "MODIFIED", copy.deepcopy(ksvc), {}, LOG)
    assert condition(fake, "Ready")["status"] == "True"
    assert fake.objects[AGENT_KEY]["status"]["url"] == "http://support-agent.my-team.example.com"
    assert fake.objects[AGENT_KEY]["status"]["latestRevision"] == "support-agent-00001"
    assert condition(fake, "MemoryReady")["status"] == "True"


async def test_a_deleted_workload_is_recreated(runtime: Runtime, fake: FakeKube) -> None:
    stored_agent(fake)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    gone = fake.objects.pop(KSVC_KEY)
    await workload_changed(runtime, "DELETED", gone, {}, LOG)
    assert KSVC_KEY in fake.objects


async def test_events_of_foreign_workloads_are_ignored(runtime: Runtime, fake: FakeKube) -> None:
    stored_agent(fake)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    before = len(fake.status_patches)
    foreign = copy.deepcopy(fake.objects[KSVC_KEY])
    foreign["metadata"]["ownerReferences"][0]["uid"] = "another-incarnation"
    await workload_changed(runtime, "MODIFIED", foreign, {}, LOG)
    assert len(fake.status_patches) == before


async def test_a_refused_apply_is_reported_on_the_object(runtime: Runtime, fake: FakeKube) -> None:
    stored_agent(fake)
    fake.fail_apply["Service"] = KubeError("PATCH", "/x", 422, '{"reason": "Invalid", "message": "bad template"}')
    with pytest.raises(ReconcileError) as caught:
        await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert not caught.value.retriable
    ready = condition(fake, "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "ApplyFailed", "bad template")


async def test_a_conflict_is_retriable(runtime: Runtime, fake: FakeKube) -> None:
    stored_agent(fake)
    fake.fail_apply["ServiceAccount"] = KubeError("PATCH", "/x", 409, "{}")
    with pytest.raises(ReconcileError) as caught:
        await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    assert caught.value.retriable


async def test_registry_change_rewires_current_and_dropped_members(runtime: Runtime, fake: FakeKube) -> None:
    def shared(spec: dict[str, Any]) -> None:
        spec["sessionMemory"]["scope"] = "shared"

    stored_agent(fake, shared)
    member = {"namespace": "my-team", "name": "support-agent"}
    registry = fake.put(
        {
            "apiVersion": kube.API_VERSION,
            "kind": kube.REGISTRY_KIND,
            "metadata": {"name": "support-team", "generation": 1},
            "spec": {"members": [member, {"namespace": "my-team", "name": "not-created-yet"}]},
        }
    )
    index = {("my-team", "support-agent"): ["support-team"], ("my-team", "not-created-yet"): ["support-team"]}
    await registry_changed(runtime, copy.deepcopy(registry), index, LOG, deleted=False)
    assert fake.objects[AGENT_KEY]["status"]["scope"] == "shared"
    registry_key = (kube.API_VERSION, kube.REGISTRY_KIND, None, "support-team")
    assert fake.objects[registry_key]["status"]["memberCount"] == 2

    # Dropped from the registry: status.members still names it, so it is re-wired to its private layout.
    dropped = copy.deepcopy(fake.objects[registry_key])
    dropped["spec"]["members"] = []
    dropped["metadata"]["generation"] = 2
    await registry_changed(runtime, dropped, {}, LOG, deleted=False)
    assert fake.objects[AGENT_KEY]["status"]["scope"] == "session"
    assert condition(fake, "MemoryReady")["reason"] == "NotARegistryMember"
    assert fake.objects[registry_key]["status"]["memberCount"] == 0


async def test_an_up_to_date_registry_touches_nothing(runtime: Runtime, fake: FakeKube) -> None:
    registry = {
        "metadata": {"name": "t", "generation": 1},
        "spec": {"members": []},
        "status": {
            "observedGeneration": 1,
            "memberCount": 0,
            "members": [],
            "unreachableMembers": [],
            "keyPrefix": "mem:shared:t:",
            "conditions": [
                {
                    "type": "MembersWired",
                    "status": "True",
                    "reason": "AllMembersWatched",
                    "message": "all 0 member(s) are in namespaces the operator watches",
                    "observedGeneration": 1,
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    }
    await registry_changed(runtime, registry, {}, LOG, deleted=False)
    assert fake.applied == [] and fake.status_patches == []


async def test_without_knative_the_conditions_name_the_fix_once(
    runtime: Runtime, fake: FakeKube, warnings: Warnings
) -> None:
    stored_agent(fake)
    # What the API server answers for a kind it does not serve: a plain-text 404.
    fake.fail_apply["Service"] = KubeError("PATCH", "/apis/serving.knative.dev/v1/x", 404, "404 page not found")
    for _ in range(2):  # a resync must not repeat the Event; nothing to retry either: the status says it all
        await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    message = "Knative Serving is not installed; use executionModel: deployment"
    ready, memory = condition(fake, "Ready"), condition(fake, "MemoryReady")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "KnativeServingNotInstalled", message)
    assert (memory["status"], memory["reason"]) == ("False", "KnativeServingNotInstalled")
    assert warnings.posted == [("support-agent", "KnativeServingNotInstalled", message)]


async def test_every_finding_is_an_event_once(runtime: Runtime, fake: FakeKube, warnings: Warnings) -> None:
    def asks_too_much(spec: dict[str, Any]) -> None:
        spec["sessionMemory"].update({"redact": ["email", "badge-id"], "perUser": True, "backend": {"addr": "v:1"}})

    stored_agent(fake, asks_too_much)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)  # a resync: nothing new to say
    assert [reason for _, reason, _ in warnings.posted] == [
        "UnknownRedactor",
        "UserCapabilityKeyMissing",
        "BackendAddrIgnored",
    ]
    memory = condition(fake, "MemoryReady")
    assert (memory["status"], memory["reason"]) == ("False", "UnknownRedactor")
    assert fake.applied.count(KSVC_KEY) == 2  # still wired: the launcher is there, its calls would fail


async def test_members_outside_the_watched_namespaces_are_not_retried(fake: FakeKube, warnings: Warnings) -> None:
    config = OperatorConfig(proxy_url="http://proxy:8000", namespaces=("my-team",))
    runtime = Runtime(config=config, kube=cast(KubeApi, fake), post_warning=warnings)
    stored_agent(fake)
    outside = {"namespace": "other-team", "name": "helper"}
    registry = fake.put(
        {
            "apiVersion": kube.API_VERSION,
            "kind": kube.REGISTRY_KIND,
            "metadata": {"name": "support-team", "generation": 1},
            "spec": {"members": [{"namespace": "my-team", "name": "support-agent"}, outside]},
        }
    )
    # No exception: nothing for kopf to retry (the API server would answer 403 forever).
    await registry_changed(runtime, copy.deepcopy(registry), {}, LOG, deleted=False)
    registry_key = (kube.API_VERSION, kube.REGISTRY_KIND, None, "support-team")
    status = fake.objects[registry_key]["status"]
    assert status["unreachableMembers"] == [outside]
    assert status["conditions"][0]["reason"] == "MembersOutsideWatchedNamespaces"
    assert [key[2] for key in fake.applied] == ["my-team", "my-team"]  # only the watched member was applied
    assert [(name, reason) for name, reason, _ in warnings.posted] == [
        ("support-team", "MembersOutsideWatchedNamespaces")
    ]
    # The status write comes back as an event: up to date, nothing re-applied, no second Event.
    applied = len(fake.applied)
    await registry_changed(runtime, copy.deepcopy(fake.objects[registry_key]), {}, LOG, deleted=False)
    assert len(fake.applied) == applied and len(warnings.posted) == 1


async def test_a_resync_repairs_a_deleted_child_and_writes_nothing_else(runtime: Runtime, fake: FakeKube) -> None:
    stored_agent(fake)
    await reconcile_agent(runtime, "my-team", "support-agent", {}, LOG)
    patches = len(fake.status_patches)
    del fake.objects[SA_KEY]  # someone deleted the agent's ServiceAccount
    assert await resync_all(runtime, {}, LOG) == 1
    assert SA_KEY in fake.objects
    assert len(fake.status_patches) == patches  # nothing new to record
