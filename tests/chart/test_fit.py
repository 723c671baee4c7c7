"""The chart on the clusters people run (issue #38): a mirror registry, existing ServiceAccounts, extra env and
volumes, security contexts that OpenShift's restricted-v2 accepts, and a HorizontalPodAutoscaler for the proxy.
Rendered with `helm template`, no API server."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from sessionmem_core import env
from tests.chart.test_lint import (
    CHART,
    RELEASE,
    Doc,
    containers,
    find,
    names,
    plain_env,
    pod_spec,
    render,
    run_helm,
    workloads,
)

OPENSHIFT_API = ("--api-versions", "security.openshift.io/v1")
PLATFORM_IDS = ("runAsUser", "runAsGroup", "fsGroup", "seLinuxOptions")


def _values_file(tmp_path: Path, values: Mapping[str, object]) -> tuple[str, str]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return ("-f", str(path))


def _images(docs: list[Doc]) -> set[str]:
    found = {container["image"] for workload in workloads(docs) for container in containers(workload)}
    operator = find(docs, "Deployment", names()["operator"])
    found.add(plain_env(containers(operator)[0])[env.OPERATOR_LAUNCHER_IMAGE])
    return found


def _refused(*args: str) -> str:
    proc = run_helm("template", RELEASE, str(CHART), *args, check=False)
    assert proc.returncode != 0, f"{args} was accepted"
    return proc.stderr


def test_by_default_every_image_is_as_its_repository_names_it() -> None:
    assert _images(render()) == {"ghcr.io/ctxmesh/sessionmem:0.1.0", "valkey/valkey:8.1"}


def test_a_global_registry_replaces_the_registry_of_every_image() -> None:
    mirror = "mirror.example.com:5000/hub"
    images = _images(render("--set", f"global.imageRegistry={mirror}"))
    assert images == {f"{mirror}/ctxmesh/sessionmem:0.1.0", f"{mirror}/valkey/valkey:8.1"}


def test_an_images_own_registry_applies_to_it_alone_and_the_global_one_wins() -> None:
    images = _images(render("--set", "valkey.image.registry=registry.internal"))
    assert images == {"ghcr.io/ctxmesh/sessionmem:0.1.0", "registry.internal/valkey/valkey:8.1"}
    own_and_global = ("--set", "valkey.image.registry=registry.internal", "--set", "global.imageRegistry=m.example")
    both = _images(render(*own_and_global))
    assert both == {"m.example/ctxmesh/sessionmem:0.1.0", "m.example/valkey/valkey:8.1"}


def test_a_registry_keeps_a_digest_pin() -> None:
    digest = "sha256:" + "cd" * 32
    images = _images(render("--set", "global.imageRegistry=m.example", "--set", f"image.digest={digest}"))
    assert f"m.example/ctxmesh/sessionmem@{digest}" in images


def test_an_existing_service_account_is_used_bound_and_not_created() -> None:
    docs = render("--set", "proxy.serviceAccount.create=false", "--set", "proxy.serviceAccount.name=platform-proxy")
    proxy = find(docs, "Deployment", names()["proxy"])
    assert pod_spec(proxy)["serviceAccountName"] == "platform-proxy"
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts == {names()["operator"]}
    bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    proxy_bindings = [b for b in bindings if b["metadata"]["name"].startswith(names()["proxy"])]
    assert proxy_bindings and all(s["name"] == "platform-proxy" for b in proxy_bindings for s in b["subjects"])
    operator_bindings = [b for b in bindings if b["metadata"]["name"].startswith(names()["operator"])]
    assert operator_bindings and all(s["name"] == names()["operator"] for b in operator_bindings for s in b["subjects"])


def test_a_created_service_account_can_be_named() -> None:
    docs = render("--set", "operator.serviceAccount.name=sm-op")
    assert find(docs, "ServiceAccount", "sm-op")
    assert pod_spec(find(docs, "Deployment", names()["operator"]))["serviceAccountName"] == "sm-op"


@pytest.mark.parametrize("component", ["operator", "proxy"])
def test_not_creating_a_service_account_needs_its_name(component: str) -> None:
    stderr = _refused("--set", f"{component}.serviceAccount.create=false")
    assert f"/{component}/serviceAccount/name" in stderr, stderr


@pytest.mark.parametrize(
    ("component", "kind"), [("operator", "Deployment"), ("proxy", "Deployment"), ("valkey", "StatefulSet")]
)
def test_extra_env_volumes_and_mounts_reach_each_component(tmp_path: Path, component: str, kind: str) -> None:
    extra = {
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://egress:3128"}],
        "extraVolumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
    }
    docs = render(*_values_file(tmp_path, {component: extra}))
    workload = find(docs, kind, names()[component])
    main = pod_spec(workload)["containers"][0]
    assert {"name": "HTTPS_PROXY", "value": "http://egress:3128"} in main["env"]
    assert {"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True} in main["volumeMounts"]
    assert {"name": "ca", "configMap": {"name": "corporate-ca"}} in pod_spec(workload)["volumes"]
    # The chart's own entries are still there.
    assert any(m["mountPath"] == "/tmp" for m in main["volumeMounts"])


def test_security_contexts_are_merged_over_the_defaults_and_null_removes_one(tmp_path: Path) -> None:
    values = {
        "proxy": {
            "podSecurityContext": {"runAsUser": 20000, "fsGroupChangePolicy": None},
            "containerSecurityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "sm.json"}},
        }
    }
    docs = render(*_values_file(tmp_path, values))
    spec = pod_spec(find(docs, "Deployment", names()["proxy"]))
    assert spec["securityContext"]["runAsUser"] == 20000
    assert "fsGroupChangePolicy" not in spec["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    context = spec["containers"][0]["securityContext"]
    assert context["seccompProfile"] == {"type": "Localhost", "localhostProfile": "sm.json"}
    assert context["readOnlyRootFilesystem"] is True and context["capabilities"] == {"drop": ["ALL"]}
    # Other components keep the defaults.
    assert pod_spec(find(docs, "Deployment", names()["operator"]))["securityContext"]["runAsUser"] == 10001


def _ids_left(docs: list[Doc]) -> set[str]:
    left = set()
    for workload in workloads(docs):
        contexts = [pod_spec(workload).get("securityContext", {})]
        contexts += [c.get("securityContext", {}) for c in containers(workload)]
        left |= {key for context in contexts for key in PLATFORM_IDS if key in context}
    return left


@pytest.mark.parametrize(
    "args",
    [OPENSHIFT_API, ("--set", "global.compatibility.openshift.adaptSecurityContext=force")],
    ids=["auto-on-openshift", "force"],
)
def test_on_openshift_the_platform_assigns_the_ids_and_the_rest_stays_restricted(args: tuple[str, ...]) -> None:
    """restricted-v2 refuses a fixed uid outside the namespace's range; it accepts everything else we set."""
    docs = render(*args)
    assert _ids_left(docs) == set()
    for workload in workloads(docs):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in containers(workload):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["readOnlyRootFilesystem"] is True


def test_elsewhere_or_when_disabled_the_ids_stay_fixed() -> None:
    assert _ids_left(render()) == {"runAsUser", "runAsGroup", "fsGroup"}
    disabled = ("--set", "global.compatibility.openshift.adaptSecurityContext=disabled")
    assert _ids_left(render(*OPENSHIFT_API, *disabled)) == {"runAsUser", "runAsGroup", "fsGroup"}


def test_the_image_runs_under_a_uid_without_a_passwd_entry() -> None:
    """kopf names its peering identity after getpass.getuser(), which falls back to the passwd file."""
    runtime = (CHART.parents[1] / "Dockerfile").read_text(encoding="utf-8").split("AS runtime", 1)[1]
    assert "LOGNAME=" in runtime


def test_no_autoscaler_by_default_and_the_replica_count_is_the_charts() -> None:
    docs = render("--set", "proxy.replicas=3")
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert find(docs, "Deployment", names()["proxy"])["spec"]["replicas"] == 3


def test_the_autoscaler_owns_the_proxys_replicas_beside_its_disruption_budget() -> None:
    docs = render(
        "--set",
        "proxy.autoscaling.enabled=true",
        "--set",
        "proxy.autoscaling.maxReplicas=6",
        "--set",
        "proxy.autoscaling.targetMemoryUtilizationPercentage=80",
    )
    proxy = find(docs, "Deployment", names()["proxy"])
    assert "replicas" not in proxy["spec"]
    hpa = find(docs, "HorizontalPodAutoscaler", names()["proxy"])
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": names()["proxy"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    targets = {m["resource"]["name"]: m["resource"]["target"]["averageUtilization"] for m in hpa["spec"]["metrics"]}
    assert targets == {"cpu": 70, "memory": 80}
    assert find(docs, "PodDisruptionBudget", names()["proxy"])


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (("proxy.autoscaling.minReplicas=5", "proxy.autoscaling.maxReplicas=3"), "is above maxReplicas"),
        (("proxy.autoscaling.targetCPUUtilizationPercentage=null",), "needs targetCPUUtilizationPercentage"),
        (("proxy.autoscaling.minReplicas=0",), "/proxy/autoscaling/minReplicas"),
    ],
)
def test_an_autoscaler_that_cannot_work_is_refused(settings: tuple[str, ...], why: str) -> None:
    args = ["--set", "proxy.autoscaling.enabled=true"]
    for setting in settings:
        args += ["--set", setting]
    assert why in _refused(*args)


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("global.imageRegistry=has space", "/global/imageRegistry"),
        ("image.registry=https://m.example", "/image/registry"),
        ("global.compatibility.openshift.adaptSecurityContext=maybe", "/global/compatibility/openshift"),
        ("proxy.extraEnv[0].value=x", "/proxy/extraEnv/0"),
        ("valkey.extraVolumeMounts[0].name=v", "/valkey/extraVolumeMounts/0"),
    ],
)
def test_the_schema_refuses_what_would_not_work(setting: str, where: str) -> None:
    stderr = _refused("--set", setting)
    assert "values don't meet the specifications of the schema" in stderr and where in stderr, stderr


def test_helm_lint_is_clean_with_every_new_value(tmp_path: Path) -> None:
    extra = {
        "extraEnv": [{"name": "X", "value": "1"}],
        "extraVolumes": [{"name": "v", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "v", "mountPath": "/v"}],
        "podSecurityContext": {"runAsUser": 20000},
        "containerSecurityContext": {"readOnlyRootFilesystem": True},
    }
    values: dict[str, object] = {
        "global": {"imageRegistry": "m.example", "compatibility": {"openshift": {"adaptSecurityContext": "force"}}},
        "image": {"registry": "r.example"},
        "operator": {**extra, "serviceAccount": {"create": False, "name": "op"}},
        "proxy": {**extra, "serviceAccount": {"name": "px"}, "autoscaling": {"enabled": True}},
        "valkey": {**extra, "image": {"registry": "r.example"}},
    }
    proc = run_helm("lint", "--strict", str(CHART), *_values_file(tmp_path, values))
    assert "0 chart(s) failed" in proc.stdout, proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))], proc.stdout
