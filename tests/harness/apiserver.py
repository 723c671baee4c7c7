"""A real Kubernetes control plane for tests (in the spirit of controller-runtime's envtest).

`KubeTestCluster.start()` runs etcd, kube-apiserver (RBAC, static admin token, service-account token
issuing) and kube-controller-manager restricted to the garbage-collector and namespace controllers, so
ownerReference cascading deletion and namespace clean-up really happen. There are no nodes, no scheduler
and no workload controllers: Deployments are stored and validated, but no Pods are created.

Binaries come from tools/envtest/ensure-binaries.sh, which builds them once into a per-user cache.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from .pki import Pki, generate_pki
from .rest import JsonObject, KubeApiError, KubeRestClient, ManifestSource, load_manifests

REPO_ROOT = Path(__file__).resolve().parents[2]
ENSURE_SCRIPT = REPO_ROOT / "tools" / "envtest" / "ensure-binaries.sh"
REPO_CRD_DIR = REPO_ROOT / "charts" / "sessionmem" / "crds"  # what Helm installs; crds/ links here
CRD_DIR_ENV = "SESSIONMEM_CRD_DIR"  # overrides REPO_CRD_DIR for repo_crd_paths()

DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "admin"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
DEFAULT_CONTROLLERS = ("garbage-collector-controller", "namespace-controller")
KEEP_ENV = "SESSIONMEM_ENVTEST_KEEP"  # set to 1 to keep the tmp folder (logs, etcd data) after stop()
LOG_TAIL_LINES = 60
TMP_PREFIX = "sessionmem-kube-"
OWNER_FILE = ".owner-pid"
KEPT_FILE = ".kept"

_binaries_lock = threading.Lock()
_binaries_dir: Path | None = None


class ClusterStartError(RuntimeError):
    """The control plane could not be brought up (or CRDs could not be installed)."""


class ProcessStartError(ClusterStartError):
    """A control-plane process died or never became ready; the message carries the tail of its log."""


def ensure_binaries(*, quiet: bool = False) -> Path:
    """Run tools/envtest/ensure-binaries.sh (builds on first use, 5-20 min) and return the cache folder that
    holds `bin/` and `knative/`. Cached per process after the first call."""
    global _binaries_dir
    with _binaries_lock:
        if _binaries_dir is not None and (_binaries_dir / "bin" / "kube-apiserver").exists():
            return _binaries_dir
        if not ENSURE_SCRIPT.exists():
            raise FileNotFoundError(ENSURE_SCRIPT)
        # stderr (build progress) goes straight to the terminal/CI log, stdout is the folder.
        proc = subprocess.run(
            ["bash", str(ENSURE_SCRIPT)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ClusterStartError(f"{ENSURE_SCRIPT} failed with exit code {proc.returncode}")
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        if not lines:
            raise ClusterStartError(f"{ENSURE_SCRIPT} printed no folder")
        folder = Path(lines[-1].strip())
        if not (folder / "bin" / "kube-apiserver").exists():
            raise ClusterStartError(f"{ENSURE_SCRIPT} printed {folder}, which holds no bin/kube-apiserver")
        _binaries_dir = folder
        return folder


def knative_crd_paths() -> list[Path]:
    """The Knative Serving CRDs (Service, Configuration, Revision, Route) from the envtest cache."""
    folder = ensure_binaries() / "knative"
    paths = sorted(folder.glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"no Knative CRDs in {folder}")
    return paths


def repo_crd_paths() -> list[Path]:
    """The project's own CRDs (the chart's crds/*.yaml, *.yml, or $SESSIONMEM_CRD_DIR), possibly none."""
    folder = Path(os.environ.get(CRD_DIR_ENV) or REPO_CRD_DIR)
    if not folder.is_dir():
        return []
    return sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed but not yet reaped process is a zombie: dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def sweep_stale_tmp_dirs(tmp_root: Path | None = None) -> None:
    """Remove tmp folders left by harness processes that were killed before they could clean up (their
    control-plane children died with them). Folders kept on purpose (failed start, $SESSIONMEM_ENVTEST_KEEP)
    are left alone."""
    root = Path(tmp_root or tempfile.gettempdir())
    for d in root.glob(f"{TMP_PREFIX}*"):
        try:
            if (d / KEPT_FILE).exists():
                continue
            pid = int((d / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if not _pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ManagedProcess:
    """A child process in its own session (process group), logging to a file."""

    name: str
    argv: list[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._log.write(f"# {' '.join(self.argv)}\n".encode())
        self._log.flush()
        # PR_SET_PDEATHSIG fires when the forking *thread* ends, so only use it from the main thread.
        linux_main = sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if linux_main else None,
            env=dict(self.env) if self.env is not None else None,
        )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise ProcessStartError(
                f"{self.name} exited with code {self.popen.returncode}; last lines of {self.log_path}:\n"
                f"{_tail(self.log_path)}"
            )

    def failure(self, what: str) -> ProcessStartError:
        return ProcessStartError(f"{self.name}: {what}; last lines of {self.log_path}:\n{_tail(self.log_path)}")

    def stop(self, timeout: float = 10.0) -> None:
        p = self.popen
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout)
        # Anything left in the group (the binaries do not fork, but be thorough).
        if p is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None


_live_clusters: weakref.WeakSet[KubeTestCluster] = weakref.WeakSet()


@atexit.register
def _stop_all_clusters() -> None:
    for cluster in list(_live_clusters):
        with contextlib.suppress(Exception):
            cluster.stop()


class KubeTestCluster:
    """etcd + kube-apiserver + kube-controller-manager (GC and namespace controllers) on 127.0.0.1.

    Usage::

        with KubeTestCluster(crd_paths=knative_crd_paths()) as cluster:
            cluster.create_namespace("demo")
            cluster.apply_manifests(Path("deploy.yaml"), namespace="demo")

    CRDs given to the constructor are installed *before* the controller-manager starts, so the garbage
    collector watches their kinds from the start (it re-discovers new kinds only every 30 seconds).
    """

    def __init__(
        self,
        *,
        crd_paths: Sequence[ManifestSource] = (),
        binaries_dir: Path | None = None,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        extra_api_audiences: Sequence[str] = (),
        extra_apiserver_args: Sequence[str] = (),
        start_timeout: float = 90.0,
        tmp_root: Path | None = None,
    ) -> None:
        self._crd_paths = list(crd_paths)
        self._binaries_dir = binaries_dir
        self.controllers = list(controllers)
        self.issuer = DEFAULT_ISSUER
        self.api_audiences = [self.issuer, *[a for a in extra_api_audiences if a != self.issuer]]
        self._extra_apiserver_args = list(extra_apiserver_args)
        self.start_timeout = start_timeout
        self._tmp_root = tmp_root

        self.tmp_dir: Path = Path()
        self.pki: Pki | None = None
        self.admin_token = ""
        self.server_url = ""
        self.kubeconfig_path = Path()
        self.etcd_url = ""
        self.processes: list[ManagedProcess] = []
        self._rest: KubeRestClient | None = None
        self._started = False
        self.startup_seconds = 0.0

    # ---- lifecycle ----------------------------------------------------------------------------------------

    def __enter__(self) -> KubeTestCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def ca_path(self) -> Path:
        if self.pki is None:
            raise RuntimeError("cluster not started")
        return self.pki.ca_cert

    @property
    def client_cert_path(self) -> Path:
        """Admin client certificate (CN=admin, O=system:masters), an alternative to the token."""
        if self.pki is None:
            raise RuntimeError("cluster not started")
        return self.pki.admin_cert

    @property
    def client_key_path(self) -> Path:
        if self.pki is None:
            raise RuntimeError("cluster not started")
        return self.pki.admin_key

    @property
    def rest(self) -> KubeRestClient:
        """The harness's REST client (admin)."""
        if self._rest is None:
            raise RuntimeError("cluster not started")
        return self._rest

    def start(self) -> None:
        if self._started:
            return
        t0 = time.monotonic()
        bindir = (self._binaries_dir or ensure_binaries()) / "bin"
        sweep_stale_tmp_dirs(self._tmp_root)
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=self._tmp_root))
        (self.tmp_dir / OWNER_FILE).write_text(str(os.getpid()))
        self._started = True
        _live_clusters.add(self)
        try:
            self._start(bindir)
        except ProcessStartError:
            self.stop(keep_tmp=True)  # keep the logs the message points at
            raise
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0

    def _start(self, bindir: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        tmp = self.tmp_dir
        self.pki = pki = generate_pki(tmp / "pki")

        # etcd
        etcd_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = ManagedProcess(
            "etcd",
            [
                str(bindir / "etcd"),
                "--name=default",
                f"--data-dir={tmp / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            tmp / "etcd.log",
        )
        self._launch(etcd)
        self._wait_http(etcd, f"{self.etcd_url}/health", deadline, verify=False, expect=b'"health":"true"')

        # kube-apiserver
        self.admin_token = secrets.token_urlsafe(32)
        kcm_token = secrets.token_urlsafe(32)
        tokens = tmp / "tokens.csv"
        tokens.write_text(
            f'{self.admin_token},{ADMIN_USER},admin-uid,"system:masters"\n'
            f'{kcm_token},{CONTROLLER_MANAGER_USER},kcm-uid,"system:masters"\n',
            encoding="utf-8",
        )
        tokens.chmod(0o600)
        port = free_port()
        self.server_url = f"https://127.0.0.1:{port}"
        apiserver = ManagedProcess(
            "kube-apiserver",
            [
                str(bindir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={tmp / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={self.issuer}",
                f"--service-account-key-file={pki.sa_public_key}",
                f"--service-account-signing-key-file={pki.sa_signing_key}",
                f"--api-audiences={','.join(self.api_audiences)}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
                *self._extra_apiserver_args,
            ],
            tmp / "kube-apiserver.log",
        )
        self._launch(apiserver)
        self._wait_http(apiserver, f"{self.server_url}/readyz", deadline, token=self.admin_token)

        self.kubeconfig_path = tmp / "kubeconfig"
        self.write_kubeconfig(self.kubeconfig_path)
        self._rest = KubeRestClient(self.server_url, pki.ca_cert, self.admin_token)

        if self._crd_paths:
            self.install_crds(self._crd_paths, timeout=max(deadline - time.monotonic(), 10.0))

        # kube-controller-manager
        kcm_kubeconfig = tmp / "kcm.kubeconfig"
        self.write_kubeconfig(kcm_kubeconfig, token=kcm_token, user=CONTROLLER_MANAGER_USER)
        kcm = ManagedProcess(
            "kube-controller-manager",
            [
                str(bindir / "kube-controller-manager"),
                f"--kubeconfig={kcm_kubeconfig}",
                f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--secure-port=0",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
            tmp / "kube-controller-manager.log",
        )
        self._launch(kcm)
        # It has no health endpoint with --secure-port=0: make sure it got past flag parsing and start-up.
        settle = time.monotonic() + 1.0
        while time.monotonic() < settle:
            kcm.check_alive()
            time.sleep(0.1)

    def _launch(self, proc: ManagedProcess) -> None:
        self.processes.append(proc)
        proc.start()

    def _wait_http(
        self,
        proc: ManagedProcess,
        url: str,
        deadline: float,
        *,
        verify: bool = True,
        token: str | None = None,
        expect: bytes | None = None,
    ) -> None:
        ctx: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(self.ca_path)) if verify else False
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        last = "no answer"
        with httpx.Client(verify=ctx, headers=headers, timeout=5.0) as http:
            while True:
                proc.check_alive()
                try:
                    resp = http.get(url)
                    if resp.status_code == 200 and (expect is None or expect in resp.content):
                        return
                    last = f"HTTP {resp.status_code}: {resp.text[:1000]}"
                except httpx.HTTPError as exc:
                    last = repr(exc)
                if time.monotonic() > deadline:
                    raise proc.failure(f"not ready at {url} after {self.start_timeout}s ({last})")
                time.sleep(0.1)

    def stop(self, *, keep_tmp: bool = False) -> None:
        """Stop all processes (controller-manager, apiserver, etcd, in that order) and remove the tmp folder
        (kept if `keep_tmp` or $SESSIONMEM_ENVTEST_KEEP=1). Safe to call twice."""
        if not self._started:
            return
        self._started = False
        _live_clusters.discard(self)
        if self._rest is not None:
            self._rest.close()
            self._rest = None
        for proc in reversed(self.processes):
            proc.stop()
        self.processes = []
        if keep_tmp or os.environ.get(KEEP_ENV) == "1":
            (self.tmp_dir / KEPT_FILE).touch()
            print(f"[envtest] kept {self.tmp_dir}", file=sys.stderr)
        elif self.tmp_dir != Path():
            shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def check_processes(self) -> None:
        """Raise (with the log tail) if one of the control-plane processes died."""
        for proc in self.processes:
            proc.check_alive()

    # ---- client configuration -----------------------------------------------------------------------------

    def kubeconfig_dict(self, *, token: str | None = None, user: str = ADMIN_USER) -> JsonObject:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "envtest",
                    "cluster": {"server": self.server_url, "certificate-authority": str(self.ca_path)},
                }
            ],
            "users": [{"name": user, "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user, "namespace": "default"}}],
            "current-context": "envtest",
            "preferences": {},
        }

    def write_kubeconfig(self, path: Path, *, token: str | None = None, user: str = ADMIN_USER) -> Path:
        """Write a kubeconfig for `token` (default: the admin token) to `path`."""
        path.write_text(yaml.safe_dump(self.kubeconfig_dict(token=token, user=user)), encoding="utf-8")
        path.chmod(0o600)
        return path

    def async_client_configuration(self, token: str | None = None) -> Any:
        """A kubernetes_asyncio.client.Configuration for this cluster (admin unless `token` is given)."""
        from kubernetes_asyncio import client

        cfg = client.Configuration(host=self.server_url)
        cfg.ssl_ca_cert = str(self.ca_path)
        cfg.verify_ssl = True
        cfg.api_key = {"BearerToken": token or self.admin_token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cfg

    def kubeconfig_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess (kopf, kubectl, the operator...) to talk to this cluster: `base`
        (default os.environ) with KUBECONFIG set and in-cluster hints removed."""
        env = dict(os.environ if base is None else base)
        for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBERNETES_SERVICE_PORT_HTTPS"):
            env.pop(var, None)
        env["KUBECONFIG"] = str(self.kubeconfig_path)
        return env

    # ---- helpers ------------------------------------------------------------------------------------------

    def apply_manifests(
        self, sources: ManifestSource | Iterable[ManifestSource], *, namespace: str | None = None
    ) -> list[JsonObject]:
        """Create-or-update (server-side apply) every document of the given files / YAML strings / dicts.
        Namespaced objects without metadata.namespace go to `namespace` (default "default")."""
        return [self.rest.apply(doc, namespace=namespace) for doc in load_manifests(sources)]

    def wait_for_crd_established(self, name: str, timeout: float = 30.0) -> JsonObject:
        return self.rest.wait_for_crd_established(name, timeout=timeout)

    def install_crds(self, paths: ManifestSource | Iterable[ManifestSource], timeout: float = 60.0) -> list[str]:
        """Apply CRD manifests and wait until each is Established and served; returns the CRD names.

        Note: kinds added after start() are seen by the garbage collector only after its next discovery
        resync (up to 30 s); pass CRDs to the constructor when cascading deletion of their kinds matters."""
        sources: list[ManifestSource] = [paths] if isinstance(paths, str | Path | Mapping) else list(paths)
        names: list[str] = []
        for source in sources:
            where = str(source) if isinstance(source, Path) else "<manifest>"
            try:
                for doc in load_manifests(source):
                    self.rest.apply(doc)
                    if doc.get("kind") == "CustomResourceDefinition":
                        names.append(str(doc["metadata"]["name"]))
            except (KubeApiError, ValueError, OSError) as exc:
                raise ClusterStartError(f"installing CRDs from {where} failed: {exc}") from exc
        deadline = time.monotonic() + timeout
        for name in names:
            self.rest.wait_for_crd_established(name, timeout=max(deadline - time.monotonic(), 5.0))
        return names

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        meta: JsonObject = {"name": name}
        if labels:
            meta["labels"] = dict(labels)
        self.rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
        return name

    def delete_namespace(self, name: str, *, wait: bool = False, timeout: float = 60.0) -> None:
        self.rest.delete("v1", "Namespace", name)
        if wait:
            deadline = time.monotonic() + timeout
            while self.rest.get("v1", "Namespace", name) is not None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"namespace {name} still exists after {timeout}s")
                time.sleep(0.2)

    def create_service_account(self, namespace: str, name: str) -> JsonObject:
        return self.rest.ensure_service_account(namespace, name)

    def mint_service_account_token(
        self, namespace: str, sa_name: str, audience: str | Sequence[str], expiration_seconds: int = 600
    ) -> str:
        """A bound ServiceAccount token from the real TokenRequest API (the SA must exist;
        expiration_seconds >= 600)."""
        return self.rest.mint_service_account_token(namespace, sa_name, audience, expiration_seconds)

    def token_review(self, token: str, audiences: Sequence[str] | None = None) -> JsonObject:
        """TokenReview status for `token` (as the admin)."""
        return self.rest.token_review(token, audiences)
