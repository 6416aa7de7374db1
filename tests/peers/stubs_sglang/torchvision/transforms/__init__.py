"""``torchvision.transforms`` names SGLang's multimodal modules reference at import (no behaviour)."""

import enum


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


class _Unavailable:
    def __init__(self, *_args, **_kwargs):
        raise RuntimeError("stub torchvision: transforms are not available in the peer environment")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable
