"""The Python client and its framework adapters (sessionmem_client), against the real stack."""
