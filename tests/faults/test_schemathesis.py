"""Property-based API tests (schemathesis) against the real proxy process and the launcher's memory
endpoint, from the OpenAPI documents they serve: no 500s, and every response conforms to the schema
(documented status codes, content types, bodies and headers).

Run through schemathesis' own CLI (its pytest plugin does not support pytest 9 yet), with a fixed seed
and bounded examples per operation, so a run is reproducible and takes well under two minutes. The full
report of a failing run is in the assertion message; ``st replay <id>`` is not available (no cassette),
but each failure carries the curl command that reproduces it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sessionmem_core.devauth import dev_token
from tests.faults.stack import AOF_ALWAYS, Stack, running_stack

MAX_EXAMPLES = 100
# Its own identity, so the proxy's run and the launcher's (team-a/support-agent) use separate keys.
PROXY_FUZZ_TOKEN = dev_token("fuzz", "schemathesis")
SEED = 1
# A guard against a hung run, not a speed target: the run takes about a minute on a quiet machine and several
# beside other work, and a fixed example count makes its length depend on the machine alone.
TIMEOUT_SECONDS = 900
# "No 500s, no response that breaks the schema". Not gated here (reported in docs/reliability.md):
# positive_data_acceptance and negative_data_rejection (semantic rules the schema cannot carry, such as
# the conversation-id rule or redactor names) and unsupported_method (405 without an Allow header).
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    )
)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(AOF_ALWAYS, with_launcher=True) as running:
        yield running


def run_schemathesis(schema_url: str, *headers: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("schemathesis") is None:
        pytest.fail("schemathesis is not installed: pip install -r requirements-faults.txt")
    args = [
        sys.executable, "-m", "schemathesis.cli", "run", schema_url,
        "--max-examples", str(MAX_EXAMPLES),
        "--seed", str(SEED),
        "--workers", "1",
        "--checks", CHECKS,
        "--request-timeout", "10",
        "--no-color",
        "--suppress-health-check", "all",
    ]  # fmt: skip
    for header in headers:
        args += ["--header", header]
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)


def check_run(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode == 0:
        return
    pytest.fail(f"schemathesis exited {done.returncode}\n{done.stdout[-12000:]}\n{done.stderr[-2000:]}")


def test_proxy_api_conforms_to_its_openapi(stack: Stack) -> None:
    check_run(run_schemathesis(f"{stack.proxy.base_url}/openapi.json", f"Authorization: Bearer {PROXY_FUZZ_TOKEN}"))


def test_launcher_memory_api_conforms_to_its_openapi(stack: Stack) -> None:
    check_run(run_schemathesis(f"http://127.0.0.1:{stack.memory_port}/openapi.json"))
