"""``python -m sessionmem_operator``: run the operator (cluster-wide unless the config names namespaces)."""

from __future__ import annotations

import sys

import kopf

from sessionmem_core.env import ConfigError
from sessionmem_operator.config import OperatorConfig


def main() -> None:
    try:
        # Loaded here once to fail fast with a readable message; the start-up handler loads it for kopf.
        config = OperatorConfig.load()
    except ConfigError as exc:
        print(f"sessionmem-operator: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    kopf.configure(log_format=kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL)
    # Importing registers the handlers with kopf's default registry.
    from sessionmem_operator import handlers  # noqa: F401

    kopf.run(
        standalone=True,
        clusterwide=config.clusterwide,
        namespaces=config.namespaces,
        liveness_endpoint=config.liveness_endpoint,
    )


if __name__ == "__main__":
    main()
