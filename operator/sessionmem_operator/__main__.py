"""``python -m sessionmem_operator``: run the operator (cluster-wide unless the config names namespaces)."""

from __future__ import annotations

import argparse
import asyncio
import sys

import kopf

from sessionmem_core import env
from sessionmem_core.env import ConfigError
from sessionmem_operator import kubeapi
from sessionmem_operator.config import OperatorConfig

DESCRIPTION = (
    "Run the sessionmem operator: it watches AgentDeployments and AgentRegistries and renders the agents' "
    "workloads with their memory wiring. It takes no arguments: settings come from the environment."
)
EPILOG = f"""settings (environment):
  {env.OPERATOR_CONFIG_FILE}   optional YAML file (keys: see sessionmem_operator/config.py)
  {env.OPERATOR_PROXY_URL}       the state-layer proxy URL handed to launchers
  {env.OPERATOR_LAUNCHER_IMAGE}  image of the launcher sidecar
  {env.OPERATOR_AUDIENCE}        audience of the agents' projected tokens
  {env.OPERATOR_TOKEN_EXPIRATION_SECONDS}  lifetime of those tokens
  {env.OPERATOR_NAMESPACE}       where Events about AgentRegistries go (default: the pod's namespace)
  KUBECONFIG (outside a pod)     which cluster to reconcile; without one (or in-cluster credentials) the
                                 operator exits with a message
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sessionmem_operator",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    # --help (or a stray argument) is answered before anything touches the cluster.
    parse_args(argv)
    try:
        # Loaded here once to fail fast with a readable message; the start-up handler loads it for kopf.
        config = OperatorConfig.load()
        # The same for the credentials: a login that cannot succeed would otherwise be retried forever.
        asyncio.run(kubeapi.load_configuration())
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
