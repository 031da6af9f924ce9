"""Groups whose stacks already sit on their owners: the deal by residence (docs/sharding.md).

Mixture-of-experts stacks ``(L, E, D, F)`` sharded on the expert axis over every device hold
their matrices on the devices in equal numbers. Dealt by stack position (the plan's ``k = 1``
deal) they would all move; dealt by residence each device keeps its own and only the
replicated leaves of the group are dealt in shares.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.shard_alike import shard_alike
from jax.sharding import PartitionSpec as P

from spectral_optax._distributed.wide import from_wide_each, move_dtype, to_wide
from spectral_optax._mesh.layout import context_mesh, device_view, mesh_order, spec_axes

__all__ = ["resident_axes", "stage_resident"]


def resident_axes(members, specs, mesh, axes, devices: int):
    """Per leaf, the batch axis its spec shards over every device in the mesh's order (``None``
    for a leaf without a spec: replicated, or a layout not in its type), when at least one leaf
    has one and no leaf is sharded otherwise; else ``None``. Those leaves' matrices already sit on
    ``devices`` owners in equal numbers, so the group is dealt where they are
    (:func:`stage_resident`) instead of by stack position."""
    order = mesh_order(mesh, axes)
    if math.prod(context_mesh(mesh).shape[a] for a in order) != devices:
        return None
    out: list[int | None] = []
    for (_, g), spec in zip(members, specs):
        entries = [(d, spec_axes(e)) for d, e in enumerate(spec or ()) if spec_axes(e)]
        if not entries:
            out.append(None)
            continue
        (d, names), *rest = entries
        if rest or names != order or d not in g.batch_axes or g.shape[d] % devices or g.fan_out_splits > 1:
            return None
        out.append(d)
    return out if any(d is not None for d in out) else None


def stage_resident(resident, members, xs, scale_of, compute_dtype, coefficients, devices: int):
    """The staging of :func:`~spectral_optax._distributed.execute.run_plan` for a group whose
    stacks are sharded on a batch axis over every device
    (mixture-of-experts stacks under expert parallelism): each device's owned matrices are its
    own slices, so the stack is built device-major, ``(devices * S, m, n)`` with device ``d``
    owning rows ``d S .. (d + 1) S - 1``, by moves that keep the sharded axis leading (transpose
    it first, split it into ``(devices, E / devices)``). The leaves without a spec are stacked
    together, zero-padded to a multiple of ``devices`` and dealt in equal shares. The result is
    the same permutation-invariant stack (:mod:`~spectral_optax._distributed.execute`);
    ``finish`` inverts every move."""
    flat = device_view((devices,), ("_devices",))
    dealt = jax.sharding.NamedSharding(flat, P("_devices"))
    parts, layouts = [], []
    for (_, g), x, d in zip(members, xs, resident):
        if d is not None:
            perm = (d, *(a for a in g.batch_axes if a != d), *g.fan_in_axes, *g.fan_out_axes)
            y = jnp.transpose(x, perm)
            moved = y.shape
            y = y.reshape(devices, -1, g.d_in, g.d_out)
            parts.append(jnp.swapaxes(y, 2, 3) if g.d_in > g.d_out else y)
            layouts.append((perm, moved))
    others = [i for i, d in enumerate(resident) if d is None]
    if others:
        w = jnp.concatenate([to_wide(xs[i], members[i][1]) for i in others], axis=0)
        share = -(-w.shape[0] // devices)
        w = jnp.pad(w, ((0, share * devices - w.shape[0]), (0, 0), (0, 0)))
        parts.append(jax.lax.with_sharding_constraint(w.reshape(devices, share, *w.shape[1:]), dealt))
    dtype = move_dtype(jnp.result_type(*parts), compute_dtype, coefficients)
    per_device = jnp.concatenate([y.astype(dtype) for y in parts], axis=1) if len(parts) > 1 else parts[0].astype(dtype)
    stacked = per_device.reshape(-1, *per_device.shape[2:])

    def finish(ortho):
        blocks = ortho.reshape(devices, -1, *ortho.shape[1:])
        out: dict[int, Any] = {}
        start = 0
        owned = [i for i, d in enumerate(resident) if d is not None]
        for i, (perm, moved) in zip(owned, layouts):
            g, x = members[i][1], xs[i]
            block = blocks[:, start : start + moved[0] // devices * math.prod(moved[1 : len(g.batch_axes)])]
            start += block.shape[1]
            block = (block.astype(jnp.promote_types(block.dtype, jnp.float32)) * scale_of(g)).astype(x.dtype)
            block = jnp.swapaxes(block, 2, 3) if g.d_in > g.d_out else block
            out[i] = jnp.transpose(block.reshape(moved), np.argsort(perm))
        from_wide_each(blocks[:, start:].reshape(-1, *blocks.shape[2:]), members, others, scale_of, xs, out)
        return [shard_alike(out[i], x)[0] for i, x in enumerate(xs)]

    return stacked, None, finish
