"""Shared infrastructure of the sessionmem components: the HTTP client and the ``memory.*`` telemetry.

It sits between the contract (``sessionmem_core``, no I/O) and the components (proxy, launcher, operator,
client), which may import it and the contract but never each other (tests/project/test_layers.py).
"""
