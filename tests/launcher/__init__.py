"""The in-pod launcher (sessionmem_launcher): forwarding, the memory endpoint, the managed loop, turns."""
