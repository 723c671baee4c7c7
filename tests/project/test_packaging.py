"""The client distribution (packaging/client) carries the contract, the HTTP client and the Python client
with its adapters, and nothing of the server side: a LangChain user does not install kopf or granian."""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("kopf", "fastapi", "uvicorn", "granian", "valkey", "kubernetes", "google-re2", "opentelemetry-sdk")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO / "packaging" / "client")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = out.glob("sessionmem_client-*.whl")
    return built


def test_the_client_wheel_holds_the_contract_the_http_client_and_the_client(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"sessionmem_core", "sessionmem_infra", "sessionmem_client"}
    assert "sessionmem_infra/http_client.py" in names
    assert not [n for n in names if n.startswith("sessionmem_infra/") and n.endswith(("serving.py", "telemetry.py"))]
    assert "sessionmem_client/langchain.py" in names and "sessionmem_client/openai_agents.py" in names


def test_the_client_wheel_requires_nothing_of_the_server_side(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    required = [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert required, "the client needs pydantic and orjson at least"
    assert not [r for r in required if r.lower().startswith(SERVER_ONLY)], required


def test_every_module_the_client_imports_ships_in_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """Installed alone, the client, its adapters and its contract import from the wheel only."""
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    # Every sessionmem module the client loads must come from the wheel, not from the checkout that the
    # development install also puts on the path.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import sessionmem_client, sessionmem_client.langchain; "
        "bad = [m.__file__ for n, m in sys.modules.items() if n.startswith('sessionmem_') "
        "and not (m.__file__ or '').startswith(sys.argv[1])]; print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(target)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_client_wheel_installs_the_kubectl_plugin_with_its_own_extra(wheel: Path) -> None:
    """kubectl finds ``kubectl-sessionmem`` (and its completion) on PATH; what it needs of Kubernetes is an
    extra, so an agent installing the client gets none of it."""
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
        (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    assert "kubectl-sessionmem = sessionmem_client.kubectl:main" in scripts
    assert "kubectl_complete-sessionmem = sessionmem_client.kubectl:complete" in scripts
    kubectl_extra = [r for r in metadata.get_all("Requires-Dist") or [] if "extra == 'kubectl'" in r.replace('"', "'")]
    assert any(r.startswith("kubernetes-asyncio") for r in kubectl_extra), kubectl_extra
