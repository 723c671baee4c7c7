"""Fault-injection tests: Valkey, the proxy, Valkey Cluster nodes and the control plane killed under load."""
