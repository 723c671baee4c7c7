"""The in-pod launcher: the agent's localhost memory endpoint and the managed loop around the agent."""
