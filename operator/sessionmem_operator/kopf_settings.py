"""How kopf itself behaves for this operator (applied in the start-up handler)."""

from __future__ import annotations

import logging
import os
import socket

import kopf

from sessionmem_core import kube
from sessionmem_operator.config import OperatorConfig

# Watches that never hear back are re-opened: a silent stall must not freeze reconciliation.
# An integer: the API server rejects "270.0" as timeoutSeconds.
WATCH_SERVER_TIMEOUT_SECONDS = 270
WATCH_CLIENT_TIMEOUT_SECONDS = 300.0
REQUEST_TIMEOUT_SECONDS = 60.0


def apply_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    # Kopf's bookkeeping goes into our own annotations on the AgentDeployments and AgentRegistries, never
    # into .status (the CRD schema is structural and would prune it) and never under kopf.zalando.org.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=kube.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=kube.GROUP, key="last-handled-configuration"
    )
    # No deletion handlers are registered, so kopf never adds this finalizer: deletion is the garbage
    # collector's job (everything the operator makes carries a controller owner reference). Named anyway so
    # a future deletion handler would not block on a kopf.zalando.org marker.
    settings.persistence.finalizer = f"{kube.GROUP}/operator"

    # Events: only warnings (e.g. NotARegistryMember) become Kubernetes Events; routine progress stays in
    # the logs instead of flooding `kubectl describe`.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = kube.MANAGED_BY
    settings.posting.reporting_instance = os.environ.get("HOSTNAME") or socket.gethostname()
    settings.posting.event_name_prefix = "sessionmem-"

    # One replica (the chart's default): no peering objects to install or to wait on.
    settings.peering.standalone = True

    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_SECONDS
    settings.networking.request_timeout = REQUEST_TIMEOUT_SECONDS
    # Only the workloads the operator made are streamed, filtered by the API server rather than in Python.
    # (Knative Services are watched by knative_watch.py, with the same selector.)
    selector = f"{kube.LABEL_MANAGED_BY}={kube.MANAGED_BY}"
    settings.watching.label_selectors["apps", "v1", "deployments"] = selector

    # Errors in our handlers are retried with a short backoff (TemporaryError carries its own delay).
    settings.execution.default_backoff = 5.0
