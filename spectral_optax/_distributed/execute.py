"""Distributed execution of the orthogonalization plan (docs/sharding.md).

:func:`run_plan` runs every shape group of the tree as its
:class:`~spectral_optax._distributed.plan.GroupPlan` says, on the devices of the updates' mesh
(jit with ``NamedSharding``). A group's matrices are stacked in their wide form (``m <= n``;
``NS(G^T) = NS(G)^T``), then

* whole matrices (``k = 1``) are constrained to ``P(owners)`` on the devices viewed as
  ``(N, 1)``, so XLA moves each to its owner and back; a group tiled over two mesh axes goes
  by one all-to-all each way (:func:`_owned_from_tiles`); a group of stacks sharded on a batch
  axis over every device (mixture-of-experts) is dealt where its matrices are
  (:func:`~spectral_optax._distributed.resident.stage_resident`);
* split matrices (``k > 1``) run under ``shard_map``, their columns cut over the ``k`` devices
  of an owner group and the short-side Gram matrix summed over them every step
  (:func:`~spectral_optax.newton_schulz` with ``axis_name``;
  :func:`_split_everywhere`, :func:`_split_in_groups`), a pack of whole matrices riding in a
  split group's stack (:func:`_packed`; from 2-D tiles by all-to-alls, :func:`_packed_columns`).

Any permutation of rows or columns, of matrices in a stack and zero padding leave the
iteration's result unchanged (``NS(P G Q) = P NS(G) Q`` for permutations; zero columns add
nothing to the Gram matrix or the norms), which is what lets the layout be chosen for the
collectives. ``orthogonalize(stack, method=None, axis_name=None)`` is the transform's
batched iteration.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.shard_alike import shard_alike
from jax.sharding import PartitionSpec as P

from spectral_optax._distributed.columns import COLUMNS, column_layouts, stage_columns, wide_tilings
from spectral_optax._distributed.deal import tile_deal
from spectral_optax._distributed.plan import columns_multiple
from spectral_optax._distributed.resident import resident_axes, stage_resident
from spectral_optax._distributed.shared import co_placed
from spectral_optax._distributed.stepwise import one_axis_steps, through
from spectral_optax._distributed.views import group_view
from spectral_optax._distributed.wide import from_wide, move_dtype, to_wide
from spectral_optax._geometry import Geometry, from_matrix, to_matrix
from spectral_optax._mesh.layout import (
    blocks_local,
    context_mesh,
    device_view,
    is_explicit,
    mesh_order,
    spec_axes,
)

__all__ = ["run_plan"]


def run_plan(
    groups, plan, leaves, orthogonalize, scale_of, compute_dtype, coefficients, specs=None, mesh=None, axes=()
):
    """Every group orthogonalized as its plan says; the finished leaves, in ``groups`` order, each
    scaled by ``scale_of(geometry)`` (the transform's factor of that leaf).

    A group's wide matrices are stacked to ``(B, m, n)`` (:func:`_stage`), zero-padded to ``B'``
    (a multiple of the ``N / k`` owner groups) and ``n'`` (a multiple of ``k``, of ``N`` when
    ``1 < k < N``, for the deal of :func:`_split_in_groups`; zero columns stay zero and change
    neither the Gram matrix nor the norms). Whole matrices
    (``k = 1``) are constrained to ``P(owners)`` on the devices viewed as ``(N, 1)``: XLA moves
    every matrix to its owner (all-to-all from FSDP / tensor-parallel layouts) and back
    (``shard_alike`` with the input; on ``Explicit`` meshes the leaf's ``PartitionSpec`` as the
    output sharding); a group of whole matrices tiled over two mesh axes goes to its owners and
    back by one all-to-all each way (:func:`_owned_from_tiles`). A split group (``k > 1``) runs
    under ``shard_map``: over every device when it has one owner group
    (:func:`_split_everywhere`), else over the devices viewed as an ``(N / k, k)`` mesh with the
    Gram sums over each owner group's ``k`` devices (:func:`_split_in_groups`), which also runs a
    pack (:func:`~spectral_optax._distributed.plan.pack_groups`: the packed group's matrices ``k`` side by
    side in a unit whose Gram matrices are not summed, :func:`_packed`; both groups staged by
    columns when both are 2-D tiles or one-axis layouts, :func:`_columns_route`,
    :func:`_packed_columns`). Fused-fan-out leaves of one geometry and layout are cut into their
    blocks as one stack (:func:`_fused_local`, :func:`_fused_units`).
    """
    it, spec_it = iter(leaves), iter(specs or [None] * len(leaves))
    inputs = {key: ([next(it) for _ in members], [next(spec_it) for _ in members]) for key, members in groups.items()}
    own = {key: _columns_route(plan[key], members, *inputs[key], mesh, axes) for key, members in groups.items()}
    # a pack is staged by columns when both of its groups can be (else both go the generic way)
    columns = {key: own[key] and (plan[key].packed_with is None or own[plan[key].packed_with]) for key in groups}
    staged = {}
    for key, members in groups.items():
        xs, ss = inputs[key]
        staged[key] = _stage(
            plan[key], members, xs, ss, scale_of, compute_dtype, coefficients, mesh, axes, columns[key]
        )
    done: dict = {}
    for key in groups:
        gp, (stacked, tiles, _) = plan[key], staged[key]
        if gp.shared:  # whole matrices of several groups, one per device (co_place)
            if key not in done:
                shared = [staged[k] for k in gp.shared]
                splits = [plan[k].split for k in gp.shared]
                outs = co_placed(
                    [x for x, _, _ in shared], [t for _, t, _ in shared], splits, orthogonalize, mesh, axes,
                    gp.owners * gp.split,
                )  # fmt: skip
                done.update(zip(gp.shared, outs))
            continue
        if gp.packed_with is not None:
            if gp.split > 1:
                other = plan[gp.packed_with]
                pack = _packed_columns if tiles == COLUMNS else _packed
                done[key], done[gp.packed_with] = pack(
                    stacked, staged[gp.packed_with][0], gp, other.method, orthogonalize, mesh, axes
                )
            continue
        total, n = stacked.shape[0], stacked.shape[2]
        multiple = columns_multiple(gp.split, gp.owners * gp.split) if mesh is not None else gp.split
        pad_b, pad_n = -total % gp.owners, -n % multiple
        if pad_b or pad_n:
            stacked = jnp.pad(stacked, ((0, pad_b), (0, 0), (0, pad_n)))
        if tiles == COLUMNS and gp.owners == 1:
            ortho = _split_everywhere(stacked, orthogonalize, mesh, mesh_order(mesh, axes), gp.method)
        elif tiles == COLUMNS:
            ortho = _split_in_groups(stacked, orthogonalize, mesh, gp.owners, gp.split, split_method=gp.method)
        elif tiles:
            ortho = _owned_from_tiles(stacked, orthogonalize, mesh, axes, tiles[:2])
        elif gp.split > 1 and gp.owners == 1 and mesh is not None:
            ortho = _split_everywhere(stacked, orthogonalize, mesh, axes, gp.method)
        elif gp.split > 1 and mesh is not None:
            ortho = _split_in_groups(stacked, orthogonalize, mesh, gp.owners, gp.split, split_method=gp.method)
        else:
            view = device_view((gp.owners, gp.split), ("_owners", "_split"))
            owned = jax.sharding.NamedSharding(view, P("_owners", None, "_split" if gp.split > 1 else None))
            stacked = jax.lax.with_sharding_constraint(stacked, owned)
            ortho = orthogonalize(stacked, gp.method if gp.split > 1 else None)
            ortho = jax.lax.with_sharding_constraint(ortho, owned)
        done[key] = ortho[:total, :, :n] if pad_b or pad_n else ortho
    return tuple(y for key in groups for y in staged[key][2](done[key]))


def _columns_route(gp, members, xs, ss, mesh, axes) -> bool:
    """Whether a group is staged with its columns over every device by one collective per layout
    (:func:`stage_columns`): a split group, either group of a pack, or a group sharing the devices
    (``co_place``) that has no common 2-D tiling (:func:`_common_tiling`), of matrices (or stacks of them
    on unsharded batch axes) tiled over the two mesh axes, or on a one-axis mesh with rows, columns or
    nothing sharded (:func:`column_layouts`), whose columns the devices divide (:func:`_deals`)."""
    if mesh is None or (gp.split == 1 and gp.packed_with is None and not gp.shared):
        return False
    if not _deals(gp.n, gp.owners * gp.split) or (gp.shared and _common_tiling(members, ss, axes)):
        return False  # a group sharing the devices goes from a common 2-D tiling by its tiles
    if len(_fused_units(xs, members, ss)) != len(xs):
        return False
    return column_layouts([g for _, g in members], ss, axes, is_explicit(mesh, axes)) is not None


def _stage(gp, members, xs, ss, scale_of, compute_dtype, coefficients, mesh, axes, columns=False):
    """One group's matrices stacked in their wide form on the way to their owners:
    ``(stacked (B, m, n), tiles, finish)``, ``tiles`` the common 2-D tiling
    (:func:`_common_tiling`), ``COLUMNS`` (``columns``: :func:`_columns_route`) or ``None`` and
    ``finish(ortho)`` the finished leaves from the orthogonalized stack (each scaled by its own
    factor, back in its layout and dtype)."""
    devices = gp.owners * gp.split
    units = _fused_units(xs, members, ss)  # fused leaves of one layout: one cut for all
    unit_x = [xs[u[0]] if len(u) == 1 else jnp.stack([xs[i] for i in u]) for u in units]
    unit_g = [members[u[0]][1] if len(u) == 1 else _stacked(members[u[0]][1], len(u)) for u in units]
    unit_s = [ss[u[0]] if len(u) == 1 or ss[u[0]] is None else P(None, *ss[u[0]]) for u in units]
    local = [_fused_local(g, mesh, axes, devices) for g in unit_g]
    if any(len(u) > 1 and cut is None for u, (cut, _) in zip(units, local)):  # no local cut: leaf by leaf
        units = [[i] for i in range(len(xs))]
        unit_x, unit_g, unit_s = list(xs), [g for _, g in members], list(ss)
        local = [_fused_local(g, mesh, axes, devices) for g in unit_g]
    if columns:  # 2-D tilings / one-axis layouts: to full columns and back by one all-to-all per layout each way
        tilings = column_layouts([g for _, g in members], ss, axes, is_explicit(mesh, axes))
        return stage_columns(tilings, members, xs, scale_of, compute_dtype, coefficients, mesh, axes, ss)
    whole = gp.split == 1 and gp.packed_with is None and mesh is not None
    tiles = _common_tiling(members, ss, axes) if whole else None
    if not tiles and whole and not gp.shared and len(units) == len(xs):
        resident = resident_axes(members, ss, mesh, axes, devices)
        if resident is not None:  # stacks sharded on a batch axis over every device: dealt where they are
            return stage_resident(resident, members, xs, scale_of, compute_dtype, coefficients, devices)
    if tiles:  # a 2-D tiling, moved to the owners and back by one all-to-all each way
        unit_s = [None] * len(units)
    # on a mesh of several Auto axes a leaf's layout is XLA's (no spec: explicit_spec gives None), maybe a 2-D tiling
    unknown = mesh is not None and not tiles and len(axes) >= 2 and not is_explicit(context_mesh(mesh), axes)
    # a leaf tiled over several mesh axes goes to one axis of its own first, one mesh axis at a time
    names = mesh_order(mesh, axes) if mesh is not None else ()
    steps = [
        one_axis_steps(g, sp, names, devices) if cut is None else [] for g, sp, (cut, _) in zip(unit_g, unit_s, local)
    ]
    mats = [
        _via_one_axis(cut(x) if cut else _wide_to_move(through(x, st, mesh), g, devices), sp, devices, unknown)
        for x, g, sp, (cut, _), st in zip(unit_x, unit_g, unit_s, local, steps)
    ]
    if tiles:
        flips = tiles[2]
    elif gp.split > 1 or gp.packed_with is not None:  # square blocks with sharded rows go transposed
        flips = tuple(_rows_sharded(g, sp) for g, sp in zip(unit_g, unit_s))
    else:
        flips = (False,) * len(mats)
    mats = [jnp.swapaxes(m, 1, 2) if f else m for m, f in zip(mats, flips)]
    dtype = move_dtype(jnp.result_type(*mats), compute_dtype, coefficients)
    stacked = jnp.concatenate([m.astype(dtype) for m in mats], axis=0) if len(mats) > 1 else mats[0].astype(dtype)

    def finish(ortho):
        start, done = 0, {}
        for u, g, sp, (_, join), flip, st in zip(units, unit_g, unit_s, local, flips, steps):
            block = _via_one_axis(ortho[start : start + g.num_slices], sp, devices, unknown)
            block = jnp.swapaxes(block, 1, 2) if flip else block
            start += g.num_slices
            factors = [scale_of(members[i][1]) for i in u]  # each leaf's own
            if len(u) == 1:
                factor = factors[0]
            else:
                factor = jnp.repeat(jnp.asarray(factors), g.num_slices // len(u))[:, None, None]
            block = from_wide(block, g, factor, xs[u[0]].dtype, join)
            block = through(block, [*st[-2::-1], sp], mesh) if st else block
            block = block if join else blocks_local(block, g, devices)  # fused blocks joined locally
            done.update({i: block[j] for j, i in enumerate(u)} if len(u) > 1 else {u[0]: block})
        return [shard_alike(done[i], x)[0] for i, x in enumerate(xs)]

    return stacked, tiles, finish


def _rows_sharded(g: Geometry, spec) -> bool:
    """Whether a square matrix's wide view has its rows sharded by ``spec`` and its columns not
    (the FSDP layout ``P('data', None)`` of a square kernel): split over its columns it is then
    taken transposed (``NS(G^T) = NS(G)^T``), whose columns are the sharded ones, so reaching the
    column blocks is not a transposition of the layout (fewer bytes through collectives:
    docs/lab_log.md)."""
    if spec is None or g.d_in != g.d_out or g.fan_out_splits != 1:
        return False
    sharded = lambda axes: any(spec_axes(spec[a]) for a in axes)
    return sharded(g.fan_in_axes) and not sharded(g.fan_out_axes)


def _packed(split, whole, gp, whole_method, orthogonalize, mesh, axes):
    """A pack (:func:`~spectral_optax._distributed.plan.pack_groups`): the split group's ``split`` ``(B_A, m,
    k c)`` and the packed group's ``whole`` ``(B_B, m, c)``, the latter ``k`` side by side per unit
    (``(ceil(B_B / k), m, k c)``), orthogonalized as one stack of units by
    :func:`_split_in_groups` (Gram sums over the owner group for the split units only);
    ``(split result, whole result)``."""
    k = gp.split
    (count_a, m, n), count_b, cols = split.shape, whole.shape[0], whole.shape[2]
    assert n == k * cols, (split.shape, whole.shape, k)
    dtype = jnp.result_type(split, whole)
    pad = -count_b % k
    side = jnp.pad(whole, ((0, pad), (0, 0), (0, 0))) if pad else whole
    owners = gp.owners
    if _deals(n, owners * k):
        # interleaved so that the strided block dealt to device (o, s) is matrix s of the unit, its
        # columns in order (:func:`_split_in_groups`): column o' w + t of matrix s at o' k w + s w + t
        w = n // (owners * k)
        side = side.reshape(-1, k, m, owners, w).transpose(0, 2, 3, 1, 4).reshape(-1, m, n)
        unside = lambda y: y.reshape(-1, m, owners, k, w).transpose(0, 3, 1, 2, 4).reshape(-1, m, cols)
    else:
        side = side.reshape(-1, k, m, cols).transpose(0, 2, 1, 3).reshape(-1, m, n)
        unside = lambda y: y.reshape(-1, m, k, cols).transpose(0, 2, 1, 3).reshape(-1, m, cols)
    stacked = jnp.concatenate([split.astype(dtype), side.astype(dtype)], axis=0)
    total = stacked.shape[0]
    if total % gp.owners:
        stacked = jnp.pad(stacked, ((0, -total % gp.owners), (0, 0), (0, 0)))
    summed = [True] * count_a + [False] * (stacked.shape[0] - count_a)
    ortho = _split_in_groups(stacked, orthogonalize, mesh, gp.owners, k, summed, whole_method)
    return ortho[:count_a], unside(ortho[count_a:total])[:count_b]


def _packed_columns(split, whole, gp, whole_method, orthogonalize, mesh, axes):
    """A pack (as :func:`_packed`) whose two stacks come with their columns over every device in
    device order (:func:`stage_columns`): ``split`` ``(B_A, m, k c)``, ``whole`` ``(B_B, m, c)``.

    The whole matrices go to units without XLA's resharding: one all-to-all over the ``k`` devices
    of each owner group (``'_split'`` of :func:`~spectral_optax._distributed.views.group_view`)
    takes the stack from ``P(None, None, ('_owners', '_split'))`` to ``P('_split', None,
    '_owners')`` (device ``(o, s)``: column block ``o`` of the ``s``-th ``B_B / k`` of the
    matrices), which read locally is the unit stack ``(B_B / k, m, k c)`` with its columns over
    every device: unit ``u``'s block on device ``(o, s)`` is block ``o`` of matrix ``s B_B / k +
    u``, so the deal of :func:`_split_in_groups` (all-to-all over the owner groups) hands device
    ``(o, s)`` that whole matrix, its columns in order. The way back is the inverse all-to-all.
    ``(split result, whole result)``."""
    k = gp.split
    count_a, count_b = split.shape[0], whole.shape[0]
    if -count_b % k:
        whole = jnp.pad(whole, ((0, -count_b % k), (0, 0), (0, 0)))
    abstract, view = group_view(mesh, (gp.owners, k))
    spec = P(None, None, ("_owners", "_split"))
    barrier = jax.lax.optimization_barrier  # materialized, as in _split_in_groups

    def regroup(x, back=False):
        body = lambda b: jax.lax.all_to_all(barrier(b), "_split", 2 if back else 0, 0 if back else 2, tiled=True)
        with jax.sharding.use_abstract_mesh(abstract):
            x = jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(abstract, spec))
            return jax.shard_map(body, mesh=view, in_specs=spec, out_specs=spec)(x)

    side = regroup(whole.astype(split.dtype))
    stacked = jnp.concatenate([split, side], axis=0)
    total = stacked.shape[0]
    if total % gp.owners:
        stacked = jnp.pad(stacked, ((0, -total % gp.owners), (0, 0), (0, 0)))
    summed = [True] * count_a + [False] * (stacked.shape[0] - count_a)
    ortho = _split_in_groups(stacked, orthogonalize, mesh, gp.owners, k, summed, whole_method)
    return ortho[:count_a], regroup(ortho[count_a:total], back=True)[:count_b]


def _split_in_groups(
    stacked, orthogonalize, mesh, owners, split, summed=None, whole_method=None, split_method="standard"
):
    """``stacked`` ``(U, m, n')`` (``U`` a multiple of ``owners``, ``n'`` of ``split``) under
    ``shard_map`` on the devices viewed as ``(owners, split)``
    (:func:`~spectral_optax._distributed.views.group_view`): units dealt to the owner groups (``U /
    owners`` each, in order), columns cut in ``split`` blocks: strided ones when ``n'`` is a
    multiple of ``owners * split`` (:func:`_deals`; the stack enters with its columns over every
    device and one all-to-all over the owner groups deals them, one brings them back), else
    contiguous ones (XLA's resharding to ``P('_owners', None, '_split')``).
    ``summed[u]`` (default all): unit ``u`` is one matrix,
    its Gram matrix summed over the owner group every step (:func:`~spectral_optax.newton_schulz` with ``axis_name``,
    by ``split_method``: ``'gram'``, once per segment, the ``m x m`` work split over the group too);
    else each of its blocks is a whole matrix (a pack) run alone, by ``whole_method``. Where
    owner groups of one local position differ, ``lax.cond`` on the owner-group index picks the
    branch (the all-reduce is in the summing branch only, taken by whole owner groups)."""
    abstract, view = group_view(mesh, (owners, split))
    per = stacked.shape[0] // owners
    table = np.ones((owners, per), bool) if summed is None else np.asarray(summed, bool).reshape(owners, per)
    spec = P("_owners", None, "_split")
    run_split = lambda x: orthogonalize(x, split_method, "_split")
    run_whole = lambda x: orthogonalize(x, whole_method)

    def body(x):
        if table.all():
            return run_split(x)
        if not table.any():
            return run_whole(x)
        g = jax.lax.axis_index("_owners")
        outs = []
        for r in range(per):
            col, xr = table[:, r], x[r : r + 1]
            if col.all() or not col.any():
                outs.append(run_split(xr) if col.all() else run_whole(xr))
            else:
                outs.append(jax.lax.cond(jnp.asarray(col)[g], run_split, run_whole, xr))
        return jnp.concatenate(outs, axis=0) if per > 1 else outs[0]

    run = body
    if _deals(stacked.shape[2], owners * split):
        # Columns over every device in device order, dealt by one all-to-all over the owner groups
        # each way: device (o, s) gets unit o's columns of every device (o', s), a strided column
        # block (any partition of the columns serves: NS(X P) = NS(X) P for a permutation P).
        spec = P(None, None, ("_owners", "_split"))
        # (materialized first: XLA's CPU backend otherwise gives the all-to-all operands of different
        # layouts and fails its own verifier, as in _fused_local)
        barrier = jax.lax.optimization_barrier
        deal = lambda x: jax.lax.all_to_all(barrier(x), "_owners", 0, 2, tiled=True)
        back = lambda y: jax.lax.all_to_all(barrier(y), "_owners", 2, 0, tiled=True)
        run = lambda x: back(body(deal(x)))
    with jax.sharding.use_abstract_mesh(abstract):
        stacked = jax.lax.with_sharding_constraint(stacked, jax.sharding.NamedSharding(abstract, spec))
        return jax.shard_map(run, mesh=view, in_specs=spec, out_specs=spec)(stacked)


def _deals(n: int, devices: int) -> bool:
    """Whether :func:`_split_in_groups` deals a stack of ``n`` columns by all-to-alls over the owner
    groups (the columns divide over the ``devices``), with strided column blocks."""
    return n % devices == 0


def _fused_units(xs, members, specs) -> list[list[int]]:
    """The members of a group as units: each fused-fan-out leaf (QKV) with the others of its
    geometry, layout and dtype (cut and joined as one stack), every other leaf alone."""
    units: dict = {}
    for i, (x, (_, g), sp) in enumerate(zip(xs, members, specs)):
        units.setdefault((g, sp, jnp.dtype(x.dtype)) if g.fan_out_splits > 1 else i, []).append(i)
    return list(units.values())


def _stacked(g: Geometry, count: int) -> Geometry:
    """``g`` with a new leading batch axis of ``count`` leaves."""
    shift = lambda axes: tuple(a + 1 for a in axes)
    return dataclasses.replace(
        g, shape=(count, *g.shape), fan_in_axes=shift(g.fan_in_axes), fan_out_axes=shift(g.fan_out_axes)
    )


def _split_everywhere(stacked, orthogonalize, mesh, axes, method="standard"):
    """``stacked`` ``(B, m, n')`` orthogonalized with its columns cut over all ``axes`` of ``mesh``,
    under ``shard_map`` (the iteration ``method``: ``'standard'`` or the split ``'gram'``)."""
    mesh = context_mesh(mesh)
    spec = P(None, None, tuple(axes))
    stacked = jax.lax.with_sharding_constraint(stacked, jax.sharding.NamedSharding(mesh, spec))
    body = lambda block: orthogonalize(block, method, tuple(axes))
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(stacked)


def _common_tiling(members, specs, axes):
    """``(rows axis, columns axis, flips)`` when every matrix of a group (a 2-D leaf, or a stack of
    them on unsharded batch axes) has its wide view tiled over two mesh axes the same way (FSDP x
    tensor parallel: ``P('data', 'model')`` kernels with the ``P('model', 'data')`` ones transposed
    to their wide form), those two being all of ``axes``; a square matrix tiled the other way is
    taken transposed (``flips[i]``, ``NS(G^T) = NS(G)^T``). Else ``None``."""
    tilings = wide_tilings([g for _, g in members], specs, axes)
    if not tilings:
        return None
    rows, cols = tilings[0]
    flips = tuple(t != (rows, cols) for t in tilings)  # each tiling is (rows, cols) or (cols, rows)
    if any(flips) and not all(g.d_in == g.d_out for _, g in members):
        return None
    return rows, cols, flips


def _owned_from_tiles(stacked, orthogonalize, mesh, axes, tiles):
    """``stacked`` ``(B', m, n)`` (``B'`` a multiple of the ``N`` devices) tiled ``P(None, rows,
    cols)`` over two mesh axes, orthogonalized whole matrix by whole matrix under ``shard_map``:
    one all-to-all over both axes deals ``B' / N`` matrices to every device (each receiving one
    tile of each from every device, reassembled locally), and one brings the tiles back. XLA's
    partitioner would go through a one-axis layout (two all-to-alls each way)."""
    mesh = context_mesh(mesh)
    deal, back = tile_deal(mesh, axes, tiles)
    spec = P(None, *tiles[:2])
    stacked = jax.lax.with_sharding_constraint(stacked, jax.sharding.NamedSharding(mesh, spec))
    body = lambda block: back(orthogonalize(deal(block)), block.shape)
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(stacked)


#: The staged route of a split group whose matrices are 2-D tiles (:func:`stage_columns`).
def _fused_local(g: Geometry, mesh, axes, devices: int):
    """``(cut, join)`` for a leaf fusing fan-out blocks (``fan_out_splits > 1``, QKV): ``cut``
    takes the leaf to its wide view ``(slices, m, n)`` and ``join`` back, each under ``shard_map``
    on local blocks, the leaf sharded over every device on its largest batch or fan-in axis that
    they divide (one all-to-all from a layout sharded on the fused fan-out, GPT-2 ``c_attn`` under
    FSDP). Local blocks of a non-leading axis come out in another order of rows (or matrices), which
    ``join`` undoes and the iteration does not see (``NS(P G) = P NS(G)``). ``(None, None)`` for
    other leaves, or when no such axis exists."""
    axis = max(
        (a for a in g.batch_axes + g.fan_in_axes if g.shape[a] % devices == 0), key=lambda a: g.shape[a], default=None
    )
    if g.fan_out_splits == 1 or mesh is None or devices == 1 or axis is None:
        return None, None
    names = tuple(axes)
    leaf_spec = P(*[names if a == axis else None for a in range(len(g.shape))])
    dim = 0 if axis in g.batch_axes else (2 if g.d_in > g.d_out else 1)
    wide_spec = P(*[names if d == dim else None for d in range(3)])

    def local(b):
        return dataclasses.replace(g, shape=b.shape)

    def cut(x):
        m = context_mesh(mesh)
        x = jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(m, leaf_spec))
        # materialized (optimization_barrier): XLA's CPU backend otherwise gives the all-to-all to the
        # owners operands of different layouts and fails its own verifier (GPT-2 XL on 64 devices)
        body = lambda b: jax.lax.optimization_barrier(to_wide(to_matrix(b, local(b)), g, matrix=True))
        return jax.shard_map(body, mesh=m, in_specs=leaf_spec, out_specs=wide_spec)(x)

    def join(block):
        m = context_mesh(mesh)
        shape = list(g.shape)
        shape[axis] //= devices
        gl = dataclasses.replace(g, shape=tuple(shape))
        body = lambda b: from_matrix(jnp.swapaxes(b, 1, 2) if g.d_in > g.d_out else b, gl)
        return jax.shard_map(body, mesh=m, in_specs=wide_spec, out_specs=leaf_spec)(block)

    return cut, join


def _wide_to_move(x, g: Geometry, devices: int):
    """The wide view of a leaf about to be moved to its owners; with fused fan-out blocks
    (``fan_out_splits > 1``, QKV) that :func:`_fused_local` cannot cut (no batch or fan-in axis
    divisible by the devices) cut where XLA makes them local
    (:func:`~spectral_optax._mesh.layout.blocks_local`) and materialized (``optimization_barrier``):
    XLA's CPU backend otherwise fuses the block transposition into the all-to-all and fails its
    own verifier (GPT-2 XL ``c_attn`` on 64 devices: "all-to-all has operands with different
    shapes")."""
    if g.fan_out_splits == 1:
        return to_wide(x, g)
    return jax.lax.optimization_barrier(to_wide(blocks_local(x, g, devices), g))


def _via_one_axis(m, spec, devices: int, unknown: bool = False):
    """A wide view ``(slices, m, n)`` of a leaf whose (Explicit) ``spec`` shards it over several mesh
    axes (FSDP x tensor parallel), or whose layout is ``unknown`` (a mesh of several Auto axes),
    resharded with its rows (else columns) over all devices, on its way to or from the owners: XLA's
    partitioner cannot move a 2-D tiling to the owners' 1-D one directly and would replicate the
    whole stack instead ("involuntary full rematerialization"); from a 1-D or replicated layout the
    step is a local slice."""
    if not unknown and len({a for entry in (spec or ()) for a in spec_axes(entry)}) < 2:
        return m
    rows = m.shape[1] % devices == 0
    if not rows and m.shape[2] % devices:
        return m
    flat = device_view((devices,), ("_devices",))
    dims = (None, "_devices", None) if rows else (None, None, "_devices")
    return jax.lax.with_sharding_constraint(m, jax.sharding.NamedSharding(flat, P(*dims)))
