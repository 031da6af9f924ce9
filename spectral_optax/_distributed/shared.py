"""Groups sharing the devices (``co_place``): each device runs the iteration of its own matrix, or
of its own column block of a split matrix, under ``shard_map`` (docs/sharding.md, "Pod scale")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from spectral_optax._distributed.columns import COLUMNS
from spectral_optax._distributed.deal import ROWS, blocks_of, shared_deal
from spectral_optax._distributed.views import group_view
from spectral_optax._mesh.layout import context_mesh, mesh_order

__all__ = ["co_placed"]


def co_placed(stacks, tiles, splits, orthogonalize, mesh, axes, devices: int):
    """Stacks ``(B_i, m_i, n_i)`` of several groups sharing the ``N`` devices
    (:func:`~spectral_optax._distributed.plan.co_place`), stack ``i``'s matrices whole
    (``splits[i] = 1``) or cut in ``k_i = splits[i]`` column blocks, ``sum_i B_i k_i <= N``: stack
    ``i``'s matrices on the slots after stack ``i - 1``'s, a split matrix's blocks on ``k_i``
    consecutive devices, and each device orthogonalizes the matrix or block of its slot only
    (``lax.switch`` on its index; a block's Gram matrices summed over its ``k_i`` devices inside
    the branch). ``tiles[i]`` is stack ``i``'s staging: a common 2-D tiling ``(rows, cols, ...)``,
    ``COLUMNS`` (columns over every device) or falsy (any layout: with split matrices, by its rows
    where the devices divide them; else dealt by XLA from ``P(axes)`` on its first axis). The
    orthogonalized stacks, each ``(B_i, m_i, n_i)``."""
    if all(k == 1 for k in splits):
        return _whole(stacks, tiles, orthogonalize, mesh, axes, devices)
    return _split(stacks, tiles, splits, orthogonalize, mesh, axes, devices)


def _view(mesh, axes, splits, devices: int):
    """The devices viewed with one axis per step of the chain of the trailing products of ``axes``
    (in mesh order) and the splits: ``(sizes, names, of_axis, summed)``, ``of_axis[a]`` the view axes
    making up mesh axis ``a``, ``summed[k]`` the trailing view axes spanning ``k`` consecutive
    devices (``co_place`` offers only splits that make this a chain of divisors)."""
    names, sizes = mesh_order(mesh, axes), dict(context_mesh(mesh).shape)
    chain, size, spans = {1, devices, *splits}, 1, {}
    for a in reversed(names):
        spans[a] = (size, size * sizes[a])
        size *= sizes[a]
        chain.add(size)
    cs = sorted(chain)
    if any(b % a for a, b in zip(cs, cs[1:])):
        raise ValueError(f"co_place splits {splits} do not nest with the mesh axes {names} ({sizes})")
    steps = [(cs[j], cs[j + 1]) for j in reversed(range(len(cs) - 1))]  # major first: (stride, stride * size)
    view = [f"_v{j}" for j in range(len(steps))]
    of_axis = {
        a: tuple(v for v, (lo, hi) in zip(view, steps) if spans[a][0] <= lo and hi <= spans[a][1]) for a in names
    }
    summed = {k: tuple(v for v, (_, hi) in zip(view, steps) if hi <= k) for k in set(splits) if k > 1}
    return [hi // lo for lo, hi in steps], view, of_axis, summed


def _split(stacks, tiles, splits, orthogonalize, mesh, axes, devices: int):
    """:func:`co_placed` with split matrices, on a view of the devices (:func:`_view`). A split
    matrix's block ``j`` takes the columns ``j mod k`` of every device's piece of it (any partition
    of the columns serves, ``NS(X P) = NS(X) P``), so each device sends an equal share to each of
    the ``k`` owners: stacks staged by 2-D tiles or columns go by one all-to-all each way
    (:func:`~spectral_optax._distributed.deal.shared_deal`), each device zero-padding its piece's
    columns to a multiple of ``k`` (zero columns change neither the Gram matrix nor the result);
    the others are cut in ``k`` contiguous column blocks and dealt by XLA, one block per slot."""
    m = context_mesh(mesh)
    # a stack of no common staging whose rows the devices divide goes with its rows over them
    tiles = [t if t else ROWS if s.shape[1] % devices == 0 else None for s, t in zip(stacks, tiles)]
    sizes_v, view, of_axis, summed = _view(mesh, axes, splits, devices)
    abstract, concrete = group_view(mesh, sizes_v, view)
    every = tuple(view)
    counts = [s.shape[0] * k for s, k in zip(stacks, splits)]
    offsets = np.cumsum([0, *counts])
    table = np.full(devices, len(stacks), np.int32)  # a device past the last slot idles
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        table[a:b] = i
    specs, inputs, width = [], [], []
    pieces: list = []
    joins: list = []
    for s, t, k, a, b in zip(stacks, tiles, splits, offsets[:-1], offsets[1:]):
        if t:
            spec = {COLUMNS: P(None, None, every), ROWS: P(None, every, None)}.get(t) or P(
                None, *(of_axis[a] for a in t[:2])
            )
            r, c = _grid(m, t, devices)
            piece = (s.shape[1] // r, -(-(s.shape[2] // c) // k))  # a device's share of one block
            specs.append(spec)
            inputs.append(s)
            pieces.append(piece)
            width.append(piece[0] * piece[1])
            joins.append(blocks_of(m, axes, t, (piece[0] * r, piece[1] * c)))
        else:
            n = s.shape[2]
            x = jnp.pad(s, ((0, 0), (0, 0), (0, -n % k)))
            x = (
                x.reshape(s.shape[0], s.shape[1], k, -1)
                .transpose(0, 2, 1, 3)
                .reshape(counts[len(specs)], s.shape[1], -1)
            )
            specs.append(P(every, None, None))
            inputs.append(jnp.pad(x, ((a, devices - b), (0, 0), (0, 0))))
            pieces.append(None)
            width.append(0)
            joins.append(None)
    kinds = sorted({s.dtype.name for s, t in zip(stacks, tiles) if t})
    own = [kinds.index(s.dtype.name) if t else None for s, t in zip(stacks, tiles)]
    deal, back = shared_deal(every, counts, width, devices) if kinds else (None, None)

    def split_run(k):  # a block's Gram matrices summed over its k devices
        return lambda x: orthogonalize(x, "standard", summed[k])

    runs = [split_run(k) if k > 1 else orthogonalize for k in splits]
    branches = _branches(runs, len(kinds), own, joins, pieces, width, devices)

    def to_rows(x, i):  # (B, m_l, n_l) -> (B k, m_l * n_l' / k): block j of each matrix, columns j mod k
        k, (ml, q) = splits[i], pieces[i]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, q * k - x.shape[2])))
        return x.reshape(x.shape[0], ml, q, k).transpose(0, 3, 1, 2).reshape(counts[i], ml * q)

    def from_rows(y, i, n):
        k, (ml, q) = splits[i], pieces[i]
        return y.reshape(-1, k, ml, q).transpose(0, 2, 3, 1).reshape(-1, ml, q * k)[:, :, :n]

    def body(*local):
        index = 0
        for v, size in zip(view, sizes_v):
            index = index * size + jax.lax.axis_index(v)
        bufs = [
            deal([to_rows(x, i) if own[i] == j else None for i, x in enumerate(local)], jnp.dtype(kind))
            for j, kind in enumerate(kinds)
        ]
        rest = [None if t else x for x, t in zip(local, tiles)]
        outs = jax.lax.switch(jnp.asarray(table)[index], branches, *bufs, *rest)
        got = [
            back(buf, [(c, w) if o == j else None for c, w, o in zip(counts, width, own)])
            for j, buf in enumerate(outs[: len(kinds)])
        ]
        return tuple(
            outs[len(kinds) + i] if own[i] is None else from_rows(got[own[i]][i], i, x.shape[2]).astype(x.dtype)
            for i, x in enumerate(local)
        )

    with jax.sharding.use_abstract_mesh(abstract):
        inputs = [
            jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(abstract, sp))
            for x, sp in zip(inputs, specs)
        ]
        outs = jax.shard_map(body, mesh=concrete, in_specs=tuple(specs), out_specs=tuple(specs))(*inputs)
    result = []
    for o, s, t, k, a, b in zip(outs, stacks, tiles, splits, offsets[:-1], offsets[1:]):
        if t:
            result.append(o)
        else:
            y = o[a:b].reshape(s.shape[0], k, s.shape[1], -1).transpose(0, 2, 1, 3).reshape(s.shape[0], s.shape[1], -1)
            result.append(y[:, :, : s.shape[2]])
    return result


def _whole(stacks, tiles, orthogonalize, mesh, axes, devices: int):
    """Stacks of whole matrices (``(B_i, m_i, n_i)``, ``sum B_i <= N``) of several groups sharing the
    ``N`` devices (:func:`~spectral_optax._distributed.plan.co_place`): stack ``i``'s matrices on the
    slots after stack ``i - 1``'s, one matrix per device, and under ``shard_map`` each device
    orthogonalizes the matrix of its slot only (``lax.switch`` on its index; the other blocks pass
    through). Stacks tiled by a common 2-D tiling
    (:func:`~spectral_optax._distributed.execute._common_tiling`) or staged by columns
    (``COLUMNS``, :func:`~spectral_optax._distributed.columns.stage_columns`) are dealt from their
    blocks together, by one all-to-all each way per dtype
    (:func:`~spectral_optax._distributed.deal.shared_deal`: every block flattened and padded to the
    largest, so the all-to-all moves the largest matrix's size, not every stack's); the others are
    zero-padded to ``N`` matrices and dealt by XLA from ``P(axes)`` on their first axis (the devices
    in mesh order, as the others are dealt). The orthogonalized stacks, each ``(B_i, m_i, n_i)``."""
    offsets = np.cumsum([0] + [s.shape[0] for s in stacks])
    table = np.full(devices, len(stacks), np.int32)  # a device past the last slot idles
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        table[a:b] = i
    padded = [jnp.pad(s, ((a, devices - b), (0, 0), (0, 0))) for s, a, b in zip(stacks, offsets[:-1], offsets[1:])]
    run = lambda i: lambda *bs: tuple(orthogonalize(b).astype(b.dtype) if j == i else b for j, b in enumerate(bs))
    branches = [run(i) for i in range(len(stacks))] + [lambda *bs: bs]
    if not any(tiles):
        abstract, view = group_view(mesh, (devices, 1))
        spec = P("_owners", None, None)

        def body(*blocks):
            return jax.lax.switch(jnp.asarray(table)[jax.lax.axis_index("_owners")], branches, *blocks)

        with jax.sharding.use_abstract_mesh(abstract):
            padded = [jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(abstract, spec)) for x in padded]
            outs = jax.shard_map(body, mesh=view, in_specs=(spec,) * len(padded), out_specs=(spec,) * len(padded))(
                *padded
            )
        return [o[a:b] for o, a, b in zip(outs, offsets[:-1], offsets[1:])]
    m = context_mesh(mesh)
    names = mesh_order(mesh, axes)
    sizes = dict(m.shape)
    specs = [P(None, None, names) if t == COLUMNS else P(None, *t[:2]) if t else P(names, None, None) for t in tiles]
    counts = [s.shape[0] for s in stacks]
    pieces = [
        (s.shape[1] // _grid(m, t, devices)[0], s.shape[2] // _grid(m, t, devices)[1]) if t else None
        for s, t in zip(stacks, tiles)
    ]
    joins = [blocks_of(m, axes, t, s.shape[1:]) if t else None for s, t in zip(stacks, tiles)]
    width = [p[0] * p[1] if p else 0 for p in pieces]
    kinds = sorted({s.dtype.name for s, t in zip(stacks, tiles) if t})  # one all-to-all each way per dtype
    deal, back = shared_deal(names, counts, width, devices)
    own = [kinds.index(s.dtype.name) if t else None for s, t in zip(stacks, tiles)]
    dealt_branches = _branches([orthogonalize] * len(stacks), len(kinds), own, joins, pieces, width, devices)

    def tiled_body(*local):
        index = 0
        for a in names:  # the device's position in mesh order over ``axes``
            index = index * sizes[a] + jax.lax.axis_index(a)
        bufs = [
            deal([x if own[i] == k else None for i, x in enumerate(local)], jnp.dtype(kind))
            for k, kind in enumerate(kinds)
        ]
        rest = [None if t else x for x, t in zip(local, tiles)]
        outs = jax.lax.switch(jnp.asarray(table)[index], dealt_branches, *bufs, *rest)
        got = [
            back(buf, [(c, *p) if o == k else None for c, p, o in zip(counts, pieces, own)])
            for k, buf in enumerate(outs[: len(kinds)])
        ]
        return tuple(
            outs[len(kinds) + i] if own[i] is None else got[own[i]][i].astype(local[i].dtype)
            for i in range(len(stacks))
        )

    padded = [s if t else p for s, p, t in zip(stacks, padded, tiles)]  # dealt stacks are not padded
    padded = [jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(m, sp)) for x, sp in zip(padded, specs)]
    outs = jax.shard_map(tiled_body, mesh=m, in_specs=tuple(specs), out_specs=tuple(specs))(*padded)
    return [o if t else o[a:b] for o, t, a, b in zip(outs, tiles, offsets[:-1], offsets[1:])]


def _grid(mesh, staging, devices: int) -> tuple[int, int]:
    """How a staging cuts a matrix over the devices: ``(row blocks, column blocks)``."""
    if staging in (COLUMNS, ROWS):
        return (1, devices) if staging == COLUMNS else (devices, 1)
    return dict(mesh.shape)[staging[0]], dict(mesh.shape)[staging[1]]


def _branches(runs, n_bufs, own, joins, pieces, width, devices: int):
    """The ``lax.switch`` branches of :func:`co_placed`, one per stack and an idle one last. Their
    operands are the ``n_bufs`` dealt ``(N, L)`` buffers (one per dtype) and the stacks dealt by XLA
    (``None`` for the others). Branch ``i`` runs ``runs[i]``: on stack ``i``'s own block when XLA
    dealt it (``own[i]`` is ``None``), else on the matrix or column block joined
    (``joins[i]``) from the ``N`` pieces ``pieces[i]`` of its buffer, cut back into them after."""

    def branch(i):
        def go(*operands):
            bufs, rest = list(operands[:n_bufs]), list(operands[n_bufs:])
            if own[i] is None:
                rest[i] = runs[i](rest[i]).astype(rest[i].dtype)
                return (*bufs, *rest)
            buf, (join, cut) = bufs[own[i]], joins[i]
            whole = join(buf[:, : width[i]].reshape(devices, *pieces[i]))[None]
            y = cut(runs[i](whole).astype(whole.dtype)[0]).reshape(devices, width[i])
            bufs[own[i]] = jnp.pad(y, ((0, 0), (0, buf.shape[1] - width[i]))).astype(buf.dtype)
            return (*bufs, *rest)

        return go

    return [branch(i) for i in range(len(runs))] + [lambda *xs: xs]
