"""Shared infrastructure (sessionmem_infra): the HTTP clients, against a real server."""
