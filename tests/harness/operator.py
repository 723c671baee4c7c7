"""The real operator, run in-process by kopf's KopfRunner against a test cluster, configured the way the
chart configures it (env variables and a settings file)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner

from sessionmem_core import env

from .apiserver import KubeTestCluster

IN_CLUSTER_VARIABLES = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBERNETES_SERVICE_PORT_HTTPS")


class Problems(logging.Handler):
    """Collects what the operator logs at WARNING and above, to show (and judge) at the end."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        # Writes into a namespace a test just deleted fail (and are retried until the object is gone):
        # expected. Anything else the operator logged as an error is a bug.
        return [
            f"{r.name}: {r.getMessage()}"
            for r in self.records
            if r.levelno >= logging.ERROR and "being terminated" not in r.getMessage()
        ]


@contextlib.contextmanager
def run_operator(
    cluster: KubeTestCluster,
    config_dir: Path,
    *,
    settings: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    namespaces: Sequence[str] = (),
) -> Iterator[KopfRunner]:
    """Run the operator until the block ends; fail if it crashed or logged an error. `settings` go to its
    settings file (sessionmem_operator.config keys), `environ` to SESSIONMEM_OPERATOR_* variables;
    `namespaces` restricts what it watches (the chart's operator.watchNamespaces)."""
    problems = Problems()
    config_file = config_dir / "operator.yaml"
    # The proxy URLs most tests give name no proxy that runs: its health is probed only where a test asks
    # (tests/operator/test_memory_health.py runs a real one).
    file_settings = {"memoryHealthSeconds": 0, **(settings or {})}
    if namespaces:
        file_settings["namespaces"] = list(namespaces)
    config_file.write_text(yaml.safe_dump(file_settings), encoding="utf-8")
    logging.getLogger().addHandler(problems)
    try:
        with pytest.MonkeyPatch.context() as patch:
            for var in IN_CLUSTER_VARIABLES:
                patch.delenv(var, raising=False)
            for var in (env.OPERATOR_PROXY_URL, env.OPERATOR_AUDIENCE, env.OPERATOR_LAUNCHER_IMAGE):
                patch.delenv(var, raising=False)
            patch.setenv("KUBECONFIG", str(cluster.kubeconfig_path))
            patch.setenv(env.OPERATOR_CONFIG_FILE, str(config_file))
            for name, value in (environ or {}).items():
                patch.setenv(name, value)
            scope = [arg for namespace in namespaces for arg in ("--namespace", namespace)] or ["--all-namespaces"]
            args = ["run", "--standalone", *scope, "-m", "sessionmem_operator.handlers"]
            with KopfRunner(args, timeout=30) as runner:
                yield runner
    finally:
        logging.getLogger().removeHandler(problems)
    assert runner.exception is None, runner.output
    errors = problems.errors()
    assert errors == [], "\n".join(errors)
