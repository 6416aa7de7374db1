"""Selection: the pure selector, the run-time re-ranking, the plugin manager.

``from moedispatch.selector import select, select_uncached`` is public (docs/plugins.md).
"""

from moedispatch.selector.plugins import reset_registry
from moedispatch.selector.pure import clear_cache, select, select_uncached

__all__ = ["select", "select_uncached", "clear_cache", "reset_registry"]
