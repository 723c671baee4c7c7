"""The state-layer proxy: authenticates the pod, builds the key server-side, talks to Valkey."""
