"""The state-layer proxy (sessionmem_proxy): store, routes, quotas, redaction, auth and isolation."""
