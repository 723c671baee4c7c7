"""The contract (sessionmem_core): ids, keys, api names, env parsing and capabilities, without I/O."""
