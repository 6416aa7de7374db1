"""``torchvision.transforms.functional`` names SGLang imports (no behaviour)."""

from torchvision.transforms import InterpolationMode, _Unavailable  # noqa: F401


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable
