"""Stand-in for ``torchvision`` (our own code): SGLang 0.5.23's config package imports ``torchvision.transforms`` at
module level for multimodal models, and no PyPI torchvision loads against the CPU torch 2.13 wheel. The MoE helpers
the peer suite calls never use it; anything that would fails loudly."""

__version__ = "0.0.0+peers-stub"
from . import transforms  # noqa: E402,F401
