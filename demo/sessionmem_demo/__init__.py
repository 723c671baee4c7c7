"""The demo agent and the local stack that `make run` starts."""
