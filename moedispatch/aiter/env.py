"""How the dispatch model reads AITER's environment: an integer variable as AITER's ``int(os.environ.get(…))`` reads
it, a value ``int()`` rejects being an error, never a silent default (:func:`_env_int`). Which variables are AITER's
is :func:`moedispatch.core.workload.aiter_env`'s list (one list for explain, the library and this model); which of
them act under a call shape is :func:`moedispatch.aiter.activation.acting_env`."""

from __future__ import annotations

from typing import Mapping

from moedispatch.aiter.vocab import SRC_FUSED_MOE
from moedispatch.core.errors import UsageError


def _env_int(env: Mapping[str, str], key: str, default: int) -> int:
    """``int(os.environ.get(key, default))`` as AITER reads it; a value int() rejects raises UsageError (AITER itself
    raises ValueError there — never a silent default)."""
    try:
        return int(str(env.get(key, default)))
    except ValueError:
        raise UsageError(f"{key}={env.get(key)!r} is not an integer: AITER reads it with int() and raises "
                         f"ValueError ({SRC_FUSED_MOE})") from None
