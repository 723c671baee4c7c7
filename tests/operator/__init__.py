"""The operator (sessionmem_operator): pure rendering and status, and reconciles on a real kube-apiserver."""
