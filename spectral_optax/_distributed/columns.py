"""The columns route of the distributed plan: a split group's matrices staged with their columns over
every device, each layout of the group (a 2-D tiling, or on a one-axis mesh rows / columns sharded or
replicated) moved by one collective under ``shard_map`` (:func:`stage_columns`), where XLA's
partitioner would reshard leaf by leaf. Used by :mod:`spectral_optax._distributed.execute`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.shard_alike import shard_alike
from jax.sharding import PartitionSpec as P

from spectral_optax._distributed.wide import from_wide, move_dtype, to_wide
from spectral_optax._mesh.layout import context_mesh, mesh_order, spec_axes

__all__ = ["COLUMNS", "column_layouts", "stage_columns", "wide_tilings"]

COLUMNS = "columns"


def wide_tilings(geoms, specs, axes):
    """Per matrix, ``(rows axis, columns axis)`` of its wide view when every one has one fan-in and one
    fan-out axis tiled over the two mesh axes ``axes`` (FSDP x tensor parallel, either orientation)
    and its batch axes (an ``nn.scan`` stack's layers, a stack's experts) unsharded, so that its
    canonical view ``(slices, d_in, d_out)`` is tiled ``P(None, rows, cols)`` as the leaf is; else
    ``None``."""
    out = []
    for g, spec in zip(geoms, specs):
        if spec is None or g.fan_out_splits != 1 or len(g.fan_in_axes) != 1 or len(g.fan_out_axes) != 1:
            return None
        entries = tuple(spec) + (None,) * (len(g.shape) - len(spec))
        if any(entries[a] is not None for a in g.batch_axes):
            return None
        rows, cols = entries[g.fan_in_axes[0]], entries[g.fan_out_axes[0]]
        tiling = (cols, rows) if g.d_in > g.d_out else (rows, cols)
        if not all(isinstance(a, str) for a in tiling) or tiling[0] == tiling[1] or set(tiling) != set(axes):
            return None
        out.append(tiling)
    return out


def column_layouts(geoms, specs, axes, explicit: bool = False):
    """Per matrix, its layout class for :func:`stage_columns`: ``(rows axis, columns axis)`` of a 2-D
    tiling (:func:`wide_tilings`), or on a one-axis mesh ``'rows'`` / ``'columns'`` (the wide view's
    rows / columns sharded over the axis) or ``'replicated'``, for matrices (or stacks of them on
    unsharded batch axes) with one fan-in and one fan-out axis; else ``None``. ``explicit``: the mesh's
    axes are ``Explicit``, so a leaf without a spec is replicated (else its layout is unknown)."""
    tilings = wide_tilings(geoms, specs, axes)
    if tilings is not None or len(axes) != 1:
        return tilings
    out = []
    for g, spec in zip(geoms, specs):
        if spec is None and not explicit:
            return None
        if g.fan_out_splits != 1 or len(g.fan_in_axes) != 1 or len(g.fan_out_axes) != 1:
            return None
        entries = tuple(spec or ()) + (None,) * (len(g.shape) - len(spec or ()))
        named = [d for d, e in enumerate(entries) if spec_axes(e)]
        if not named:
            out.append("replicated")
            continue
        if len(named) > 1 or spec_axes(entries[named[0]]) != tuple(axes) or named[0] in g.batch_axes:
            return None
        rows = (named[0] in g.fan_in_axes) != (g.d_in > g.d_out)  # (d_in, d_out) made wide
        out.append("rows" if rows else "columns")
    return out


def _columns_of(block, mesh, layout, names, back: bool = False):
    """A stack ``(B, m, n)`` in ``layout`` (:func:`column_layouts`) to a column block of width ``n / N``
    on every device, declared in device order (``P(None, None, names)``); ``back``: the inverse. A 2-D
    tiling by :func:`_columns_of_tiles`; on a one-axis mesh ``'columns'`` is there already, ``'rows'``
    goes by one all-to-all over the axis (each device's rows cut in one column block per device),
    ``'replicated'`` by a local slice (back: an all-gather), under ``shard_map``: one collective per
    layout of the group, where XLA's partitioner would reshard leaf by leaf (an all-to-all over ``N``
    devices is ``N`` copies in the CPU backend's program)."""
    if not isinstance(layout, str):
        return _columns_of_tiles(block, mesh, layout, names, back)
    mesh = context_mesh(mesh)
    columns = P(None, None, names)
    if layout == "columns":
        return block if back else jax.lax.with_sharding_constraint(block, jax.sharding.NamedSharding(mesh, columns))
    if layout == "rows":  # the tiling (rows over the devices, columns whole)
        return _columns_of_tiles(block, mesh, (names, None), names, back)
    axis = names[0]
    if back:
        body = lambda b: jax.lax.all_gather(b, axis, axis=2, tiled=True)  # the same on every device
        return jax.shard_map(body, mesh=mesh, in_specs=columns, out_specs=P(), check_vma=False)(block)
    width = block.shape[2] // mesh.shape[axis]
    block = jax.lax.with_sharding_constraint(block, jax.sharding.NamedSharding(mesh, P()))
    body = lambda b: jax.lax.dynamic_slice_in_dim(b, jax.lax.axis_index(axis) * width, width, axis=2)
    return jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=columns)(block)


def _columns_of_tiles(block, mesh, tiling, names, back: bool = False):
    """A stack ``(B, m, n)`` tiled ``P(None, rows, cols)`` to a column block of width ``n / N`` on every
    device, declared in device order (``P(None, None, names)``), by one all-to-all over the rows axis
    under ``shard_map`` (each tile's columns cut in one block per device of its row group); ``back``:
    the inverse. The columns come out permuted (device ``(r, c)`` holds block ``c R + r``), which the
    iteration does not see (``NS(G Q) = NS(G) Q``) and ``back`` undoes."""
    mesh = context_mesh(mesh)
    rows, cols = tiling
    tiled, columns = P(None, rows, cols), P(None, None, names)
    barrier = jax.lax.optimization_barrier  # materialized, as in _split_in_groups
    if back:
        body = lambda b: jax.lax.all_to_all(barrier(b), rows, 1, 2, tiled=True)
        return jax.shard_map(body, mesh=mesh, in_specs=columns, out_specs=tiled)(block)
    block = jax.lax.with_sharding_constraint(block, jax.sharding.NamedSharding(mesh, tiled))
    body = lambda b: jax.lax.all_to_all(barrier(b), rows, 2, 1, tiled=True)
    return jax.shard_map(body, mesh=mesh, in_specs=tiled, out_specs=columns)(block)


def stage_columns(tilings, members, xs, scale_of, compute_dtype, coefficients, mesh, axes, specs=None):
    """A split group (or either group of a pack) of 2-D tiled matrices, or of matrices in one-axis layouts
    (:func:`column_layouts`), staged with its columns over every device (what :func:`_split_in_groups`
    and :func:`_split_everywhere` take), each layout's matrices moved by one collective
    (:func:`_columns_of`) instead of XLA's partitioner, whose program reshards leaf by leaf and grows as
    leaves x devices (docs/sharding.md, "2-D layouts"). With ``specs`` (Explicit meshes) each leaf is
    held in its spec on the way in and out; ``shard_alike`` with the gradient (the other case) lets
    XLA's propagation move each leaf to another layout and back (docs/lab_log.md, 2026-12-07 (9b)).
    ``(stacked, COLUMNS, finish)`` as :func:`_stage`."""
    names = mesh_order(mesh, axes)
    # a square matrix with its rows over the devices is taken transposed (NS(G^T) = NS(G)^T): its columns
    # are then the sharded ones, and it moves not at all (as _rows_sharded in _stage)
    flips = [t == "rows" and g.d_in == g.d_out for t, (_, g) in zip(tilings, members)]
    tilings = ["columns" if f else t for t, f in zip(tilings, flips)]
    classes: dict = {}
    for i, tiling in enumerate(tilings):
        classes.setdefault(tiling, []).append(i)
    specs = specs or [None] * len(xs)

    def pin(x, spec):  # a known layout (Explicit meshes) held on the way in and out
        return x if spec is None else jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh_, spec))

    mesh_ = context_mesh(mesh)
    mats = [to_wide(pin(x, sp), g) for x, sp, (_, g) in zip(xs, specs, members)]
    mats = [jnp.swapaxes(m, 1, 2) if f else m for m, f in zip(mats, flips)]
    dtype = move_dtype(jnp.result_type(*mats), compute_dtype, coefficients)
    parts = []
    for tiling, idx in classes.items():
        block = jnp.concatenate([mats[i] for i in idx], axis=0) if len(idx) > 1 else mats[idx[0]]
        parts.append(_columns_of(block.astype(dtype), mesh, tiling, names))
    stacked = jnp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]

    def finish(ortho):
        start, done = 0, {}
        for tiling, idx in classes.items():
            count = sum(members[i][1].num_slices for i in idx)
            block = _columns_of(ortho[start : start + count], mesh, tiling, names, back=True)
            start += count
            for i in idx:
                g = members[i][1]
                part, block = block[: g.num_slices], block[g.num_slices :]
                part = jnp.swapaxes(part, 1, 2) if flips[i] else part
                done[i] = pin(from_wide(part, g, scale_of(g), xs[i].dtype), specs[i])
        return [done[i] if specs[i] is not None else shard_alike(done[i], x)[0] for i, x in enumerate(xs)]

    return stacked, COLUMNS, finish
