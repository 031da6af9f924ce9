"""A layer axis that a block of a plain parameter tree shares, at a position other than 0.

``nn.scan`` stacks a block's parameters on a new leading axis, which the name
rules read as a batch axis. MaxText (``param_scan_axis: 1``, its default)
stacks them on axis 1: ``query/kernel`` is ``(embed, layers, heads, head_dim)``,
``out/kernel`` ``(heads, layers, head_dim, embed)``, the MLP's kernels ``(embed,
layers, mlp)``, the norms' scales ``(embed, layers)``. A single leaf does not show
that axis; the block does: every leaf under one module path has at least two
axes and the same size on the same axis ``a >= 1`` (and on no other such axis,
nor on axis 0), norm scales or biases (``(width, layers)``) among them. Such a
leaf is decided by the name rules on its shape without axis ``a`` (the block's
shapes likewise), axis ``a`` put back as a batch axis; a leaf they cannot decide
is warned with an override whose axes are read from the block's shapes
(:func:`suggested_axes`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

_VECTOR_LEAVES = ("scale", "bias")


def stacked_groups(shape_of: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, int]]:
    """``{path: (block path, stacked axis)}`` for every leaf of a block stacked on an axis other than 0."""
    under: dict[str, list[str]] = {}
    for p in shape_of:
        parts = p.split("/")
        for k in range(1, len(parts)):
            under.setdefault("/".join(parts[:k]), []).append(p)
    out: dict[str, tuple[str, int]] = {}
    for prefix in sorted(under, key=lambda q: q.count("/")):
        group = [p for p in under[prefix] if p not in out]
        if len(group) < 2 or len(group) != len(under[prefix]):
            continue
        shapes = [tuple(shape_of[p]) for p in group]
        if min(len(s) for s in shapes) < 2:
            continue
        if not any(p.split("/")[-1] in _VECTOR_LEAVES and len(s) == 2 for p, s in zip(group, shapes)):
            continue
        shared = [a for a in range(min(len(s) for s in shapes)) if len({s[a] for s in shapes}) == 1]
        if len(shared) != 1 or shared[0] == 0 or shapes[0][shared[0]] == 1:
            continue
        # The layer count stands on that axis only: a size that a leaf also has elsewhere (Flax attention's
        # (D, heads, head_dim) kernel beside its (heads, head_dim) bias, heads == head_dim) is no layer axis.
        a, layers = shared[0], shapes[0][shared[0]]
        if any(n == layers for s in shapes for i, n in enumerate(s) if i != a):
            continue
        for p in group:
            out[p] = (prefix, shared[0])
    return out


def drop_axis(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return tuple(shape[:axis]) + tuple(shape[axis + 1 :])


def insert_axis(axes: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """Axes of the shape without ``axis``, as axes of the shape with it."""
    return tuple(a if a < axis else a + 1 for a in axes)


def suggested_axes(
    path: str, shape: tuple[int, ...], shape_of: Mapping[str, tuple[int, ...]]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(fan_in_axes, fan_out_axes)`` that the shapes around a kernel no rule decides suggest (``None``
    if they say nothing: no stacked axis and no norm or bias gives the width).

    The model width ``D`` is the most common size of the 1-D norm scales and biases (after dropping a
    stacked axis). A kernel ``(D, ...)`` reads ``D`` (``DenseGeneral``'s ``(in, *features)``); a kernel
    ``(E, D, F)`` is ``E`` stacked ``(D, F)`` matrices (experts); ``(..., D)`` writes ``D``: ``(E, F, D)``
    if another kernel of the block is ``(E, D, F')`` (experts), else ``(*in, D)``; otherwise
    ``DenseGeneral``'s ``(in, *features)``. Non-negative axes of ``shape``; a 1-D or 2-D leaf: its last axis
    fan-out, the one before fan-in.
    """
    groups = stacked_groups(shape_of)

    def unstacked(p):
        s = tuple(shape_of[p])
        return drop_axis(s, groups[p][1]) if p in groups else s

    stacked = groups.get(path)
    sub = drop_axis(shape, stacked[1]) if stacked else tuple(shape)
    widths = Counter(unstacked(p)[0] for p in shape_of if p.split("/")[-1] in _VECTOR_LEAVES and len(unstacked(p)) == 1)
    n = len(sub)
    if not widths and not stacked:
        return None
    fan_in: tuple[int, ...] = (0,)
    fan_out: tuple[int, ...] = tuple(range(1, n))  # DenseGeneral's (in, *features)
    if n < 2:
        return None
    if widths and n >= 3:
        d = widths.most_common(1)[0][0]
        experts = {unstacked(p)[0] for p in shape_of if len(unstacked(p)) == 3 and unstacked(p)[1] == d}
        if sub[0] == d:
            pass
        elif sub[1] == d:
            fan_in, fan_out = (1,), tuple(range(2, n))
        elif sub[-1] == d:
            fan_in, fan_out = ((1,), (n - 1,)) if n == 3 and sub[0] in experts else (tuple(range(n - 1)), (n - 1,))
    if stacked:
        return insert_axis(fan_in, stacked[1]), insert_axis(fan_out, stacked[1])
    return fan_in, fan_out
