"""How many arguments a user's callable wants (factories and masks accept one or two)."""

from __future__ import annotations

import inspect
from collections.abc import Callable


def required_positional(fn: Callable, default: int | None = None) -> int | None:
    """The number of required positional parameters of ``fn`` (``default`` when it has no signature)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return default
    return sum(
        p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in sig.parameters.values()
    )
