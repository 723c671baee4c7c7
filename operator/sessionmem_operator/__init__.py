"""The sessionmem operator (kopf): renders AgentDeployments into workloads with memory wiring.

Pure modules (spec, wiring, render, status, registry, crds, config) hold the decisions; reconcile and
handlers do the I/O. Run with ``python -m sessionmem_operator``.
"""
