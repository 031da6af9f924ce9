"""``orthogonalize_via_newton_schulz``: the spectral-norm (RMS -> RMS) dual map.

Every update leaf is read through its geometry as ``num_slices`` independent
matrices ``G`` of shape ``(d_in, d_out)`` (conv kernels flattened to
``(window x in, out)``, stacked layers and QKV split blocks as slices) and
replaced by::

    scale * U V^T      (G = U S V^T, approximated by Newton-Schulz)

with ``scale`` chosen by name:

* ``'spectral'`` (default): ``sqrt(d_out / d_in)``, the spectral condition
  (``d_in`` is the geometry's ``input_width``: 1 for embeddings and vectors);
* ``'muon'``: ``sqrt(max(1, d_out / d_in))`` (the original Muon);
* ``'rms'``: ``0.2 * sqrt(max(d_in, d_out))`` (update RMS ~ 0.2 like AdamW;
  Moonlight);
* a number, or a function ``geometry -> number``.

Speed: all canonical matrices of the same ``(d_in, d_out)`` across the tree
are concatenated along the slice axis and orthogonalized in **one** batched
call (``to_matrix -> concatenate -> newton_schulz -> split -> from_matrix``).

References:
  Jordan et al. (2024), Muon; Bernstein & Newhouse (2024), "Old Optimizer,
  New Norm"; Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature
  Learning"; Liu et al. (2025), "Muon is Scalable for LLM Training".
  The math: docs/math.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental.shard_alike import shard_alike
from jax.sharding import PartitionSpec as P

from spectral_optax._duals.polar import (
    PRECONDITIONINGS,
    Coefficients,
    auto_schedule,
    default_compute_dtype,
    gram_restarts,
    newton_schulz,
    newton_schulz_method,
    resolve_coefficients,
)
from spectral_optax._geometry import (
    KINDS,
    Geometry,
    GeometryLike,
    as_geometry_map,
    from_matrix,
    path_str,
    to_matrix,
)
from spectral_optax._plan import OrthogonalizationPlan, columns_multiple, pack_groups, plan_group
from spectral_optax._sharding import (
    AxisName,
    aval_mesh,
    blocks_local,
    distribution_axes,
    explicit_spec,
    gathered,
    keeping_specs,
    manual_axes,
    mesh_size,
    spec_axes,
)

SCALES = ("spectral", "muon", "rms")
NS_METHODS = ("auto", "standard", "gram")


def orthogonal_update_scale(geometry: Geometry, scale: Any = "spectral"):
    """The factor multiplying ``U V^T`` for one leaf.

    Args:
      geometry: the leaf's :class:`~spectral_optax.Geometry`.
      scale: ``'spectral'`` ``sqrt(d_out / input_width)``, ``'muon'``
        ``sqrt(max(1, d_out / d_in))``, ``'rms'`` ``0.2 sqrt(max(d_in, d_out))``,
        a number, or a callable ``geometry -> number``.
    """
    g = geometry
    if isinstance(scale, str):
        if scale == "spectral":
            return g.target_spectral_norm
        if scale == "muon":
            return math.sqrt(max(1.0, g.d_out / g.d_in))
        if scale == "rms":
            return 0.2 * math.sqrt(max(g.d_in, g.d_out))
        raise ValueError(f"scale must be one of {SCALES}, a number or a function, got {scale!r}")
    if callable(scale):
        return scale(g)
    return scale


def orthogonalize_via_newton_schulz(
    *,
    geometry: GeometryLike = None,
    scale: Any = "spectral",
    ns_coefficients: Coefficients = "auto",
    ns_steps: int | None = None,
    compute_dtype: Any = None,
    ns_method: str = "auto",
    norm_safety: float | None = None,
    kinds: Sequence[str] = KINDS,
    precision: Any = None,
    distribute: bool | None = None,
    axis_name: AxisName = None,
    ns_preconditioning: str | None = None,
) -> optax.GradientTransformation:
    """Replace every update by ``scale * U V^T`` per batch slice (steepest descent in RMS->RMS).

    For each leaf of geometry ``g`` and each slice ``G`` of its canonical view
    ``to_matrix(update, g)`` of shape ``(d_in, d_out)``::

        update <- scale(g) * NS(G) ~ scale(g) * U V^T,    G = U S V^T.

    Same-shape matrices across the tree (tall ones transposed) are processed
    as one batched :func:`~spectral_optax.newton_schulz` call. On a mesh of
    ``N`` devices the work follows one plan for the whole tree
    (:func:`~spectral_optax.orthogonalization_plan`, docs/sharding.md): each
    shape group is dealt to the devices as whole matrices, or, when it has
    fewer matrices than devices or one costs more than a device's share, cut
    along its long side over ``k`` devices with the short-side Gram matrix
    summed over them every step (whole matrices of a split group's block shape
    ride in its stack, ``k`` to an owner group). A zero update stays zero; the
    result has the update's dtype (the iteration runs in ``compute_dtype``).

    Args:
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.
      scale: ``'spectral'`` (default, ``sqrt(d_out / d_in)``), ``'muon'``
        (``sqrt(max(1, d_out / d_in))``), ``'rms'`` (``0.2 sqrt(max(d_in,
        d_out))``), a number or a function ``geometry -> number``.
      ns_coefficients: ``'auto'`` (default: ``'quintic'`` for float32
        compute, ``'power4'`` by shape for bfloat16, ``'polar_express_schatten'`` for float16:
        :func:`spectral_optax.auto_schedule`),
        ``'quintic'`` (Muon's, 5 steps), ``'polar_express'`` (8 steps by
        default), ``'polar_express_schatten'`` (4 steps), ``'power3'`` (3 steps), ``'power4'`` (4 steps), ``'you'`` (5
        steps), an ``(a, b, c)`` triple, a table or a function ``(batch,
        d_in, d_out) -> (batch, d_in, d_out)`` replacing the iteration; see
        :func:`spectral_optax.newton_schulz`.
      ns_steps: number of Newton-Schulz steps (default from ``coefficients``).
      compute_dtype: dtype of the iteration; ``None``: float32 on CPU,
        bfloat16 on GPU/TPU.
      ns_method: ``'auto'`` | ``'standard'`` | ``'gram'`` (Gram-space iteration for
        rectangular matrices; ``'auto'`` uses it in float32 and float16 when it
        saves flops, see ``newton_schulz_method``).
      norm_safety: Frobenius-normalization safety factor (default per schedule).
      kinds: geometry kinds to orthogonalize; other leaves pass through.
        (For a vector, ``d_in = 1`` and ``U V^T`` is the vector scaled to
        unit norm, i.e. ``sqrt(d_out)`` times RMS 1 under ``'spectral'``.)
      precision: ``jax.lax.Precision`` of the matmuls.
      distribute: spread the work over the devices of the updates' mesh by
        the plan (jit with ``NamedSharding``; see docs/sharding.md). ``None``
        (default): whenever the updates live on a mesh of more than one
        device; ``False``: leave the partitioning to XLA (which shards every
        matmul of the iteration and all-gathers per step).
      axis_name: inside ``shard_map`` / ``pmap`` only: the mesh axes over
        which the update blocks are sharded: a name (``P(name)``, sharded
        along the first axis), a ``PartitionSpec`` or a tree of them (the
        parameters' ``in_specs``). Each leaf is gathered, orthogonalized
        whole and cut back to its block. ``None``: each block is taken for a
        whole matrix (right for replicated, data-parallel parameters).
      ns_preconditioning: ``None`` (the coefficients' own), ``'frobenius'``,
        ``'schatten'``, ``'aol'`` or ``'power'``: the scaling of the iteration's start, see
        :func:`spectral_optax.newton_schulz` and docs/math.md, "Orthogonalization at fewer flops".

    Returns:
      A stateless ``optax.GradientTransformation``.

    References:
      Jordan et al. (2024), Muon; Amsel et al. (2025), The Polar Express;
      Yang, Simon, Bernstein (2023). docs/math.md sections 3-4.
    """
    if isinstance(scale, str) and scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, a number or a function, got {scale!r}")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"kinds must be a subset of {KINDS}, got {tuple(kinds)}")
    if ns_method not in NS_METHODS:
        raise ValueError(f"ns_method must be one of {NS_METHODS}, got {ns_method!r}")
    resolve_coefficients(ns_coefficients, ns_steps, compute_dtype)  # validate at construction
    if ns_preconditioning is not None and ns_preconditioning not in PRECONDITIONINGS:
        raise ValueError(f"ns_preconditioning must be None or one of {PRECONDITIONINGS}, got {ns_preconditioning!r}")
    gmap = as_geometry_map(geometry)
    kinds = tuple(kinds)

    plan_args = (ns_coefficients, ns_steps, compute_dtype, ns_method, precision)

    def orthogonalize(stacked, method=None, axis_name=None):
        return newton_schulz(
            stacked,
            ns_coefficients,
            steps=ns_steps,
            compute_dtype=compute_dtype,
            method=method or ns_method,
            norm_safety=norm_safety,
            precision=precision,
            axis_name=axis_name,
            preconditioning=ns_preconditioning,
        )

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
        out = [x for _, x in flat]
        groups = _groups(flat, gmap, kinds)
        members = [member for group in groups.values() for member in group]
        if not members:
            return updates, state
        mesh = next((m for m in (aval_mesh(out[i]) for i, _ in members) if m is not None), None)
        axes = distribution_axes(mesh)
        leaves = [out[i] for i, _ in members]
        if axes and distribute is not False and not manual_axes(mesh):
            plan = _plan(groups, flat, mesh_size(mesh, axes), *plan_args)
            specs = [explicit_spec(x, x.ndim) for x in leaves]
            run = lambda *xs: _run_plan(
                groups, plan, xs, orthogonalize, scale, compute_dtype, ns_coefficients, specs, mesh, axes
            )
        else:  # one device, inside shard_map, or distribute=False (XLA partitions the matmuls)
            run = lambda *xs: _run_batched(groups, xs, orthogonalize, scale)
        for (i, _), y in zip(members, keeping_specs(run, leaves, mesh)):
            out[i] = y
        return jax.tree_util.tree_unflatten(treedef, out), state

    update_fn = gathered(update_fn, axis_name)
    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


# --------------------------------------------------------------------------
# Grouping, the plan, batching and distribution.
# --------------------------------------------------------------------------
def _groups(flat, gmap, kinds) -> dict[tuple[int, int], list[tuple[int, Geometry]]]:
    """The orthogonalized leaves by the shape ``(m, n)``, ``m <= n``, of their wide matrices (tall
    ones transposed, ``NS(G^T) = NS(G)^T``, so ``(256, 1024)`` and ``(1024, 256)`` share a batch):
    ``{(m, n): [(leaf index, geometry), ...]}``."""
    idx = [i for i, (_, x) in enumerate(flat) if hasattr(x, "shape")]
    geoms = gmap.resolve([path_str(flat[i][0]) for i in idx], [tuple(np.shape(flat[i][1])) for i in idx])
    groups: dict[tuple[int, int], list[tuple[int, Geometry]]] = {}
    for i, g in zip(idx, geoms):
        if g.kind in kinds and math.prod(g.shape):
            groups.setdefault((min(g.d_in, g.d_out), max(g.d_in, g.d_out)), []).append((i, g))
    return groups


def _plan(groups, flat, devices, coefficients, steps, compute_dtype, method, precision) -> dict:
    """One :class:`~spectral_optax._plan.GroupPlan` per group (decided at trace time)."""
    cdtype = jnp.dtype(compute_dtype) if compute_dtype is not None else jnp.dtype(default_compute_dtype())
    spec = resolve_coefficients(coefficients, steps, cdtype)  # 'auto': the iteration's dtype's
    n_steps = None if callable(spec) else len(spec[0])
    plans, methods = {}, {}
    auto = isinstance(coefficients, str) and coefficients.lower() == "auto"
    for (m, n), members in groups.items():
        dtype = jnp.dtype(jnp.result_type(*[flat[i][1].dtype for i, _ in members]))
        move = min(dtype.itemsize, cdtype.itemsize) if n_steps else dtype.itemsize
        g_method, g_restarts = method, None
        if auto:  # the shape's own default schedule (auto_schedule), as newton_schulz runs it
            coef, auto_method, g_restarts = auto_schedule(m, n, cdtype)
            n_steps = len(resolve_coefficients(coef, steps, cdtype)[0])
            g_method = auto_method if method == "auto" else method
        whole = newton_schulz_method(m, n, n_steps, cdtype, g_method, precision) if n_steps else "standard"
        rs = gram_restarts(n_steps, cdtype, precision, g_restarts) if whole == "gram" and n_steps else ()
        methods[(m, n)] = whole
        plans[(m, n)] = plan_group(
            m, n, sum(g.num_slices for _, g in members), devices, steps=n_steps, method=whole,
            compute_itemsize=cdtype.itemsize, move_itemsize=move,
            paths=tuple(path_str(flat[i][0]) for i, _ in members), restarts=rs,
        )  # fmt: skip
    return pack_groups(plans, devices, steps=n_steps, compute_itemsize=cdtype.itemsize, whole_methods=methods)


def _move_dtype(dtype, compute_dtype, coefficients):
    """Matrices travel in the iteration's dtype when it is narrower (bfloat16 on GPU/TPU)."""
    if callable(coefficients):
        return dtype
    cdtype = jnp.dtype(compute_dtype) if compute_dtype is not None else jnp.dtype(default_compute_dtype())
    return cdtype if cdtype.itemsize < jnp.dtype(dtype).itemsize else dtype


def _run_plan(groups, plan, leaves, orthogonalize, scale, compute_dtype, coefficients, specs=None, mesh=None, axes=()):
    """Every group orthogonalized as its plan says; the finished leaves, in ``groups`` order.

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
    pack (:func:`~spectral_optax._plan.pack_groups`: the packed group's matrices ``k`` side by
    side in a unit whose Gram matrices are not summed, :func:`_packed`). Fused-fan-out leaves of
    one geometry and layout are cut into their blocks as one stack (:func:`_fused_local`,
    :func:`_fused_units`).
    """
    it, spec_it = iter(leaves), iter(specs or [None] * len(leaves))
    staged = {}
    for key, members in groups.items():
        xs = [next(it) for _ in members]
        ss = [next(spec_it) for _ in members]
        staged[key] = _stage(plan[key], members, xs, ss, scale, compute_dtype, coefficients, mesh, axes)
    done: dict = {}
    for key in groups:
        gp, (stacked, tiles, _) = plan[key], staged[key]
        if gp.packed_with is not None:
            if gp.split > 1:
                other = plan[gp.packed_with]
                done[key], done[gp.packed_with] = _packed(
                    stacked, staged[gp.packed_with][0], gp, other.method, orthogonalize, mesh, axes
                )
            continue
        total, n = stacked.shape[0], stacked.shape[2]
        multiple = columns_multiple(gp.split, gp.owners * gp.split) if mesh is not None else gp.split
        pad_b, pad_n = -total % gp.owners, -n % multiple
        if pad_b or pad_n:
            stacked = jnp.pad(stacked, ((0, pad_b), (0, 0), (0, pad_n)))
        if tiles:
            ortho = _owned_from_tiles(stacked, orthogonalize, mesh, axes, tiles[:2])
        elif gp.split > 1 and gp.owners == 1 and mesh is not None:
            ortho = _split_everywhere(stacked, orthogonalize, mesh, axes)
        elif gp.split > 1 and mesh is not None:
            ortho = _split_in_groups(stacked, orthogonalize, mesh, gp.owners, gp.split)
        else:
            view = jax.sharding.AbstractMesh(
                (gp.owners, gp.split), ("_owners", "_split"), axis_types=(jax.sharding.AxisType.Auto,) * 2
            )
            owned = jax.sharding.NamedSharding(view, P("_owners", None, "_split" if gp.split > 1 else None))
            stacked = jax.lax.with_sharding_constraint(stacked, owned)
            ortho = orthogonalize(stacked, gp.method if gp.split > 1 else None)
            ortho = jax.lax.with_sharding_constraint(ortho, owned)
        done[key] = ortho[:total, :, :n] if pad_b or pad_n else ortho
    return tuple(y for key in groups for y in staged[key][2](done[key]))


def _stage(gp, members, xs, ss, scale, compute_dtype, coefficients, mesh, axes):
    """One group's matrices stacked in their wide form on the way to their owners:
    ``(stacked (B, m, n), tiles, finish)``, ``tiles`` the common 2-D tiling
    (:func:`_common_tiling`) or ``None`` and ``finish(ortho)`` the finished leaves from the
    orthogonalized stack (each scaled by its own factor, back in its layout and dtype)."""
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
    tiles = _common_tiling(members, ss, axes) if gp.split == 1 and gp.packed_with is None and mesh is not None else None
    if tiles:  # a 2-D tiling, moved to the owners and back by one all-to-all each way
        unit_s = [None] * len(units)
    mats = [
        _via_one_axis(cut(x) if cut else _wide_to_move(x, g, devices), sp, devices)
        for x, g, sp, (cut, _) in zip(unit_x, unit_g, unit_s, local)
    ]
    if tiles:
        flips = tiles[2]
    elif gp.split > 1 or gp.packed_with is not None:  # square blocks with sharded rows go transposed
        flips = tuple(_rows_sharded(g, sp) for g, sp in zip(unit_g, unit_s))
    else:
        flips = (False,) * len(mats)
    mats = [jnp.swapaxes(m, 1, 2) if f else m for m, f in zip(mats, flips)]
    dtype = _move_dtype(jnp.result_type(*mats), compute_dtype, coefficients)
    stacked = jnp.concatenate([m.astype(dtype) for m in mats], axis=0) if len(mats) > 1 else mats[0].astype(dtype)

    def finish(ortho):
        start, done = 0, {}
        for u, g, sp, (_, join), flip in zip(units, unit_g, unit_s, local, flips):
            block = _via_one_axis(ortho[start : start + g.num_slices], sp, devices)
            block = jnp.swapaxes(block, 1, 2) if flip else block
            start += g.num_slices
            factors = [orthogonal_update_scale(members[i][1], scale) for i in u]  # each leaf's own
            if len(u) == 1:
                factor = factors[0]
            else:
                factor = jnp.repeat(jnp.asarray(factors), g.num_slices // len(u))[:, None, None]
            block = _finish(block, g, factor, xs[u[0]].dtype, join)
            block = block if join else blocks_local(block, g, devices)  # fused blocks joined locally
            done.update({i: block[j] for j, i in enumerate(u)} if len(u) > 1 else {u[0]: block})
        return [shard_alike(done[i], x)[0] for i, x in enumerate(xs)]

    return stacked, tiles, finish


def _rows_sharded(g: Geometry, spec) -> bool:
    """Whether a square matrix's wide view has its rows sharded by ``spec`` and its columns not
    (the FSDP layout ``P('data', None)`` of a square kernel): split over its columns it is then
    taken transposed (``NS(G^T) = NS(G)^T``), whose columns are the sharded ones, so reaching the
    column blocks is not a transposition of the layout (Llama 6.7B scan, bfloat16, 256 devices:
    5.95x the shard through collectives, against 6.20x going through a transposition of the layout)."""
    if spec is None or g.d_in != g.d_out or g.fan_out_splits != 1:
        return False
    sharded = lambda axes: any(spec_axes(spec[a]) for a in axes)
    return sharded(g.fan_in_axes) and not sharded(g.fan_out_axes)


def _packed(split, whole, gp, whole_method, orthogonalize, mesh, axes):
    """A pack (:func:`~spectral_optax._plan.pack_groups`): the split group's ``split`` ``(B_A, m,
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


def _group_view(mesh, shape):
    """The devices of ``mesh`` (in its order) viewed as an ``(owners, split)`` mesh with axes
    ``('_owners', '_split')``: ``(abstract mesh, mesh for shard_map)``. Under ``jax.set_mesh``
    ``shard_map`` lowers on the concrete mesh, so the view is then a concrete ``Mesh`` of the same
    devices reshaped (``P(('_owners', '_split'))`` is ``P(axes)`` of the leaves' mesh). (With the
    split axis major instead, Llama 1.2B on 256 devices moved 70x its shard, against 13.4x.)"""
    names, types = ("_owners", "_split"), (jax.sharding.AxisType.Auto,) * 2
    concrete = _concrete_mesh()
    if concrete is not None and not concrete.empty and concrete.size == math.prod(shape):
        view = jax.sharding.Mesh(concrete.devices.reshape(shape), names, axis_types=types)
        return view.abstract_mesh, view
    abstract = jax.sharding.AbstractMesh(shape, names, axis_types=types)
    return abstract, abstract


def _concrete_mesh():
    """The mesh of ``jax.set_mesh`` while tracing (what ``shard_map`` lowers on), else ``None``;
    JAX has no public accessor inside ``jit`` (``jax.sharding.get_mesh`` refuses)."""
    try:
        from jax._src.mesh import get_concrete_mesh
    except ImportError:  # pragma: no cover  (a JAX without it: the abstract view)
        return None
    return get_concrete_mesh()


def _split_in_groups(stacked, orthogonalize, mesh, owners, split, summed=None, whole_method=None):
    """``stacked`` ``(U, m, n')`` (``U`` a multiple of ``owners``, ``n'`` of ``split``) under
    ``shard_map`` on the devices viewed as ``(owners, split)`` (:func:`_group_view`): units
    dealt to the owner groups (``U / owners`` each, in order), columns cut in ``split``
    blocks: strided ones when ``n'`` is a multiple of ``owners * split`` (:func:`_deals`; the
    stack enters with its columns over every device and one all-to-all over the owner groups
    deals them, one brings them back), else contiguous ones (XLA's resharding to
    ``P('_owners', None, '_split')``). ``summed[u]`` (default all): unit ``u`` is one matrix,
    its Gram matrix summed over the owner group every step (:func:`~spectral_optax.newton_schulz` with ``axis_name``);
    else each of its blocks is a whole matrix (a pack) run alone, by ``whole_method``. Where
    owner groups of one local position differ, ``lax.cond`` on the owner-group index picks the
    branch (the all-reduce is in the summing branch only, taken by whole owner groups)."""
    abstract, view = _group_view(mesh, (owners, split))
    per = stacked.shape[0] // owners
    table = np.ones((owners, per), bool) if summed is None else np.asarray(summed, bool).reshape(owners, per)
    spec = P("_owners", None, "_split")
    run_split = lambda x: orthogonalize(x, "standard", "_split")
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


def _context_mesh(mesh):
    """The context mesh when one is set (inside :func:`~spectral_optax._sharding.keeping_specs`
    its axes are ``Auto``), else ``mesh`` (the leaves' own), for ``shard_map``."""
    context = jax.sharding.get_abstract_mesh()
    return mesh if context.empty else context


def _split_everywhere(stacked, orthogonalize, mesh, axes):
    """``stacked`` ``(B, m, n')`` orthogonalized with its columns cut over all ``axes`` of ``mesh``,
    under ``shard_map``."""
    mesh = _context_mesh(mesh)
    spec = P(None, None, tuple(axes))
    stacked = jax.lax.with_sharding_constraint(stacked, jax.sharding.NamedSharding(mesh, spec))
    body = lambda block: orthogonalize(block, "standard", tuple(axes))
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(stacked)


def _common_tiling(members, specs, axes):
    """``(rows axis, columns axis, flips)`` when every matrix of a group is a plain 2-D leaf whose
    wide view is tiled over two mesh axes the same way (FSDP x tensor parallel: ``P('data',
    'model')`` kernels with the ``P('model', 'data')`` ones transposed to their wide form), those two
    being all of ``axes``; a square matrix tiled the other way is taken transposed (``flips[i]``,
    ``NS(G^T) = NS(G)^T``). Else ``None``."""
    tilings = []
    for (_, g), spec in zip(members, specs):
        if spec is None or len(g.shape) != 2 or g.fan_out_splits != 1 or g.batch_axes:
            return None
        rows, cols = spec[g.fan_in_axes[0]], spec[g.fan_out_axes[0]]
        tilings.append((cols, rows) if g.d_in > g.d_out else (rows, cols))
    rows, cols = tilings[0]
    if not (isinstance(rows, str) and isinstance(cols, str)) or rows == cols or {rows, cols} != set(axes):
        return None
    flips = tuple(t != (rows, cols) for t in tilings)
    square = all(g.d_in == g.d_out for _, g in members)
    if any(t not in ((rows, cols), (cols, rows)) for t in tilings) or (any(flips) and not square):
        return None
    return rows, cols, flips


def _owned_from_tiles(stacked, orthogonalize, mesh, axes, tiles):
    """``stacked`` ``(B', m, n)`` (``B'`` a multiple of the ``N`` devices) tiled ``P(None, rows,
    cols)`` over two mesh axes, orthogonalized whole matrix by whole matrix under ``shard_map``:
    one all-to-all over both axes deals ``B' / N`` matrices to every device (each receiving one
    tile of each from every device, reassembled locally), and one brings the tiles back. XLA's
    partitioner would go through a one-axis layout (two all-to-alls each way)."""
    mesh = _context_mesh(mesh)
    names = tuple(a for a in mesh.axis_names if a in axes)  # the all-to-all's device order
    sizes = dict(mesh.shape)
    r, c = sizes[tiles[0]], sizes[tiles[1]]
    rows_first = names[0] == tiles[0]
    spec = P(None, *tiles)
    n_dev = r * c

    def body(block):
        b, mr, nc = block.shape
        x = jax.lax.all_to_all(block.reshape(n_dev, b // n_dev, mr, nc), names, 0, 0, tiled=True)
        x = x.reshape(*((r, c) if rows_first else (c, r)), b // n_dev, mr, nc)
        x = x.transpose((2, 0, 3, 1, 4) if rows_first else (2, 1, 3, 0, 4)).reshape(b // n_dev, r * mr, c * nc)
        y = orthogonalize(x)
        y = y.reshape(b // n_dev, r, mr, c, nc).transpose((1, 3, 0, 2, 4) if rows_first else (3, 1, 0, 2, 4))
        y = jax.lax.all_to_all(y.reshape(n_dev, b // n_dev, mr, nc), names, 0, 0, tiled=True)
        return y.reshape(b, mr, nc)

    stacked = jax.lax.with_sharding_constraint(stacked, jax.sharding.NamedSharding(mesh, spec))
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(stacked)


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
        m = _context_mesh(mesh)
        x = jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(m, leaf_spec))
        # materialized (optimization_barrier): XLA's CPU backend otherwise gives the all-to-all to the
        # owners operands of different layouts and fails its own verifier (GPT-2 XL on 64 devices)
        body = lambda b: jax.lax.optimization_barrier(_wide(to_matrix(b, local(b)), g, matrix=True))
        return jax.shard_map(body, mesh=m, in_specs=leaf_spec, out_specs=wide_spec)(x)

    def join(block):
        m = _context_mesh(mesh)
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
    (:func:`~spectral_optax._sharding.blocks_local`) and materialized (``optimization_barrier``):
    XLA's CPU backend otherwise fuses the block transposition into the all-to-all and fails its
    own verifier (GPT-2 XL ``c_attn`` on 64 devices: "all-to-all has operands with different
    shapes")."""
    if g.fan_out_splits == 1:
        return _wide(x, g)
    return jax.lax.optimization_barrier(_wide(blocks_local(x, g, devices), g))


def _via_one_axis(m, spec, devices: int):
    """A wide view ``(slices, m, n)`` of a leaf whose (Explicit) ``spec`` shards it over several mesh
    axes (FSDP x tensor parallel) resharded with its rows (else columns) over all devices, on its way
    to or from the owners: XLA's partitioner cannot move a 2-D tiling to the owners' 1-D one directly
    and would replicate the whole stack instead ("involuntary full rematerialization")."""
    if len({a for entry in (spec or ()) for a in spec_axes(entry)}) < 2:
        return m
    rows = m.shape[1] % devices == 0
    if not rows and m.shape[2] % devices:
        return m
    flat = jax.sharding.AbstractMesh((devices,), ("_devices",), axis_types=(jax.sharding.AxisType.Auto,))
    dims = (None, "_devices", None) if rows else (None, None, "_devices")
    return jax.lax.with_sharding_constraint(m, jax.sharding.NamedSharding(flat, P(*dims)))


def _run_batched(groups, leaves, orthogonalize, scale):
    """Every group as one batched call where it is (one device, shard_map blocks, or XLA's
    partitioning of every matmul with ``distribute=False``)."""
    out, it = [], iter(leaves)
    for members in groups.values():
        xs = [next(it) for _ in members]
        blocks = _batched([_wide(x, g) for x, (_, g) in zip(xs, members)], orthogonalize)
        out.extend(_finish(b, g, scale, x.dtype) for b, x, (_, g) in zip(blocks, xs, members))
    return tuple(out)


def _wide(x, g: Geometry, matrix: bool = False):
    """The canonical view ``(num_slices, d_in, d_out)`` (``x`` itself if ``matrix``), transposed to ``m <= n``."""
    m = x if matrix else to_matrix(x, g)
    return jnp.swapaxes(m, 1, 2) if g.d_in > g.d_out else m


def _finish(block, g: Geometry, scale, dtype, join=None):
    """``scale(g) * block`` (wide) back in the leaf's shape and dtype (by ``join`` when given);
    ``scale`` a number or an array is the factor itself."""
    factor = orthogonal_update_scale(g, scale)
    block = (block.astype(jnp.promote_types(block.dtype, jnp.float32)) * factor).astype(dtype)
    if join is not None:
        return join(block)
    if g.d_in > g.d_out:
        block = jnp.swapaxes(block, 1, 2)
    return from_matrix(block, g)


def _batched(mats, orthogonalize):
    """Concatenate ``mats`` on the slice axis, orthogonalize once, split back."""
    dtype = jnp.result_type(*mats)
    stacked = mats[0] if len(mats) == 1 else jnp.concatenate([m.astype(dtype) for m in mats], axis=0)
    ortho = orthogonalize(stacked)
    if len(mats) == 1:
        return [ortho]
    blocks, start = [], 0
    for m in mats:
        blocks.append(ortho[start : start + m.shape[0]])
        start += m.shape[0]
    return blocks


def orthogonalization_plan(
    updates,
    *,
    devices: int | None = None,
    geometry: GeometryLike = None,
    ns_coefficients: Coefficients = "auto",
    ns_steps: int | None = None,
    compute_dtype: Any = None,
    ns_method: str = "auto",
    kinds: Sequence[str] = KINDS,
    precision: Any = None,
) -> OrthogonalizationPlan:
    """The plan :func:`orthogonalize_via_newton_schulz` follows for ``updates`` on ``devices`` devices.

    ``print(orthogonalization_plan(params))`` shows, for every group of
    same-shape matrices, the split ``k`` (devices sharing one matrix), the
    owner groups, the matrices per device and the predicted flops and bytes
    per device (the cost model and its formula: docs/sharding.md, "The plan").

    Args:
      updates: a tree of arrays or ``jax.ShapeDtypeStruct`` (shapes, dtypes and, for the device
        count, shardings as the updates will have them; parameters have the same).
      devices: number of devices the work is spread over; ``None``: every device of the mesh in
        the leaves' shardings, excluding ``Manual`` axes (1 when there is none).
      geometry: as in :func:`orthogonalize_via_newton_schulz`.
      ns_coefficients: as in :func:`orthogonalize_via_newton_schulz` (default ``'auto'``, as there).
      ns_steps: as in :func:`orthogonalize_via_newton_schulz`.
      compute_dtype: as in :func:`orthogonalize_via_newton_schulz`.
      ns_method: as in :func:`orthogonalize_via_newton_schulz`.
      kinds: as in :func:`orthogonalize_via_newton_schulz`.
      precision: as in :func:`orthogonalize_via_newton_schulz`.

    Returns:
      An :class:`~spectral_optax.OrthogonalizationPlan` (``str()`` prints the table).
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(updates)
    groups = _groups(flat, as_geometry_map(geometry), tuple(kinds))
    if devices is None:
        mesh = next((m for m in (aval_mesh(x) for _, x in flat) if m is not None), None)
        devices = mesh_size(mesh, distribution_axes(mesh)) if mesh is not None else 1
    plans = _plan(groups, flat, devices, ns_coefficients, ns_steps, compute_dtype, ns_method, precision)
    return OrthogonalizationPlan(devices, tuple(plans.values()))
