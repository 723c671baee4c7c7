"""The sessionmem contract: the rules every component shares.

Each rule lives in exactly one module here (ids, keys, wire models, env names, errors) and every
component (proxy, launcher, operator) imports it from here instead of restating it.
"""
