"""The operator's own watch of the Knative Services it made, for as long as it runs, whenever Knative
Serving is installed.

Not a kopf handler: kopf looks up which kinds the API server serves at start and again only on a CRD
event, and with Knative installed while the operator ran the last CRD event often came before the API
server listed the new kind (its watch never started: the agent's Ready and URL lagged until a resync, or
a restart). Here a kind that is not served (404) is asked for again every ``RETRY_SECONDS``, and a kind
whose storage is still starting (429) or a dropped connection is retried the same way, quietly: so
Knative Serving installed at any time is watched within seconds, with no restart.

Each object and each change goes to ``reconcile.workload_changed`` (Ready and the URL mirrored, a
deleted workload re-created), as the Deployments' kopf handler does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sessionmem_core import kube
from sessionmem_operator.kubeapi import KNATIVE_SERVICE, KubeApi, KubeError
from sessionmem_operator.reconcile import Logger, ReconcileError

# How soon Knative Serving installed (or a broken watch) is picked up again.
RETRY_SECONDS = 5.0
# The server ends each watch after this long and it starts again (a silent stall cannot last longer).
WATCH_SECONDS = 270
SELECTOR = f"{kube.LABEL_MANAGED_BY}={kube.MANAGED_BY}"

OnEvent = Callable[[str | None, Mapping[str, Any]], Awaitable[None]]


async def watch_forever(
    kube_api: KubeApi, namespace: str | None, on_event: OnEvent, logger: Logger, retry_seconds: float = RETRY_SECONDS
) -> None:
    """Watch the operator's Knative Services in `namespace` (None: all) until cancelled."""
    served: bool | None = None
    while True:
        try:
            async for event_type, body in kube_api.watch(KNATIVE_SERVICE, namespace, SELECTOR, WATCH_SECONDS):
                if not served:
                    served = True
                    logger.info("watching Knative Services (%s)", namespace or "all namespaces")
                try:
                    await on_event(event_type, body)
                except ReconcileError as exc:
                    # Fail open for the stream: the next change of the workload brings a fresh try.
                    logger.warning("%s", exc)
            continue  # the server ended the watch: start it again
        except KubeError as exc:
            if exc.status == 404:
                if served is not False:
                    logger.info("Knative Serving is not installed: its Services are watched once it is")
                served = False
            elif exc.status not in (0, 410, 429) and exc.status < 500:
                # A refusal (403: the chart's RBAC was changed): say so, and keep trying.
                logger.warning("watching Knative Services failed: %s", exc)
        await asyncio.sleep(retry_seconds)
