"""The Helm chart and the container image: rendered and linted offline, installed on a real kube-apiserver."""
