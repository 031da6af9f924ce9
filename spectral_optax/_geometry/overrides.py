"""Overrides: ``{regex: override}`` turned into a :class:`Geometry` per leaf.

An override is ``re.search``-ed on a leaf's '/'-joined path; its value is a
:class:`Geometry` (of the leaf's shape), a kind name (``'matrix'``,
``'embedding'``, ``'vector'``, ``'elementwise'``), a dict of :class:`Geometry`
fields (a matrix by default, fan-in ``(-2,)`` and fan-out ``(-1,)``), or a
callable ``(path, shape) -> override``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from spectral_optax._geometry.types import ELEMENTWISE, Geometry, GeometryError

Override = Any  # Geometry | str kind | Mapping of Geometry fields | Callable[(path, shape), Geometry]


def _apply_override(override: Override, path: str, shape: tuple[int, ...]) -> Geometry:
    """The :class:`Geometry` that ``override`` gives the leaf ``(path, shape)``."""
    if isinstance(override, Geometry):
        if override.shape != shape:
            raise GeometryError(
                f"override for parameter '{path}' has shape {override.shape}, but the parameter has shape {shape}"
            )
        return override
    if callable(override):
        g = override(path, shape)
        return _apply_override(g, path, shape)
    if isinstance(override, str):
        override = {"kind": override}
    if isinstance(override, Mapping):
        fields = dict(override)
        kind = fields.pop("kind", "matrix")
        ndim = len(shape)
        try:
            if kind == "vector":
                return Geometry.vector(shape, **fields)
            if kind == "embedding":
                return Geometry.embedding(shape, **fields)
            if kind == ELEMENTWISE:
                return Geometry.elementwise(shape, **fields)
            if ndim < 2 and "fan_in_axes" not in fields:
                raise GeometryError("a matrix needs >= 2 axes or explicit fan_in_axes")
            fields.setdefault("fan_in_axes", (-2,))
            fields.setdefault("fan_out_axes", (-1,))
            return Geometry(shape, "matrix", **fields)
        except (GeometryError, TypeError) as e:
            raise GeometryError(f"invalid geometry override for parameter '{path}' {shape}: {e}") from e
    raise GeometryError(
        f"override for parameter '{path}' must be a Geometry, a kind string, a dict of Geometry "
        f"fields or a callable (path, shape) -> Geometry; got {type(override).__name__}"
    )


def _compile_overrides(overrides: Mapping[str, Override]) -> list:
    """``[(compiled regex, override)]`` in the given order (the first match wins)."""
    out = []
    for k, v in overrides.items():
        try:
            out.append((re.compile(k), v))
        except re.error as e:
            raise GeometryError(
                f"geometry override {k!r} is not a valid regular expression ({e}); overrides map a regex "
                "re.search-ed on the '/'-joined parameter path to a Geometry, a kind or a dict of fields"
            ) from e
    return out


def _override_help(
    path: str, shape: tuple[int, ...], axes: tuple[tuple[int, ...], tuple[int, ...]] | None = None
) -> str:
    """The lines of an error or warning that show the override fixing the leaf ``(path, shape)``;
    ``axes`` (fan-in, fan-out) are the ones its surroundings suggest (default: the last two axes)."""
    pattern = "/".join(path.split("/")[-2:]) + "$"
    fan_in, fan_out = axes if axes is not None else ((-2,), (-1,))
    return (
        "Fix it with an override, matched by regex on the '/'-joined path, e.g.\n"
        f"    geometry={{r'{pattern}': dict(kind='matrix', fan_in_axes={tuple(fan_in)}, "
        f"fan_out_axes={tuple(fan_out)})}}\n"
        "  (axes in neither list are batch axes: stacked layers, heads, experts), or\n"
        f"    geometry={{r'{pattern}': spectral_optax.Geometry.vector({shape})}},\n"
        "  or let the model tell: spectral_optax.GeometryMap.from_linen(model, x) / "
        "GeometryMap.from_nnx(model, x) / GeometryMap.from_apply(apply_fn, params, x)."
    )


def _looks_like_regex_dict(d: Mapping) -> bool:
    """A regex dict maps patterns straight to overrides; an explicit geometry
    tree is nested like the params it describes."""

    def is_override(v):
        if isinstance(v, (Geometry, str)) or callable(v):
            return True
        return isinstance(v, Mapping) and bool(set(v) & {"kind", "fan_in_axes", "fan_out_axes"})

    return all(isinstance(k, str) for k in d) and all(is_override(v) for v in d.values())
