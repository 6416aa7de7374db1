"""Built-in moedispatch backends, installed as the ``moedispatch_plugins`` package.

Each module is registered through the ``moedispatch.backends`` entry-point group exactly like a third-party
plugin (see ``pyproject.toml``), and exposes a ``register_backends`` hook implementation.
"""
