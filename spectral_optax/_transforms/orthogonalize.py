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

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spectral_optax._distributed.execute import run_plan
from spectral_optax._distributed.plan import (
    GroupPlan,
    OrthogonalizationPlan,
    co_place,
    default_flops_per_byte,
    pack_groups,
    plan_group,
    with_gram_splits,
)
from spectral_optax._distributed.wide import from_wide, to_wide
from spectral_optax._duals.polar import (
    PRECONDITIONINGS,
    Coefficients,
    auto_schedule,
    default_compute_dtype,
    default_preconditioning,
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
    path_str,
)
from spectral_optax._mesh.layout import (
    AxisName,
    aval_mesh,
    distribution_axes,
    explicit_spec,
    gathered,
    keeping_specs,
    manual_axes,
    mesh_order,
    mesh_size,
    replica_axes,
    replica_groups,
)

SCALES = ("spectral", "muon", "rms")
#: Replica groups run the orthogonalization each on their own devices (no traffic over the replica
#: axes, the slow links of multi-slice training) while that costs at most this factor in flops per
#: device over spreading it on every device (docs/sharding.md, "3-D meshes: within each replica group").
REPLICA_FLOPS_FACTOR = 4.0
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
    kinds: Sequence[str] = ("matrix",),
    precision: Any = None,
    distribute: bool | None = None,
    axis_name: AxisName = None,
    ns_preconditioning: str | None = None,
    flops_per_byte: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Replace every update by ``scale * U V^T`` per batch slice (steepest descent in RMS->RMS).

    For each leaf of geometry ``g`` and each slice ``G`` of its canonical view
    ``to_matrix(update, g)`` of shape ``(d_in, d_out)``::

        update <- scale(g) * NS(G) ~ scale(g) * U V^T,    G = U S V^T.

    Same-shape matrices across the tree (tall ones transposed) are processed
    as one batched :func:`~spectral_optax.newton_schulz` call. On a mesh of
    ``N`` devices the work follows one plan for the whole tree
    (:func:`~spectral_optax.expert.orthogonalization_plan`, docs/sharding.md): each
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
        :func:`spectral_optax.expert.auto_schedule`),
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
      kinds: geometry kinds to orthogonalize (default: matrices only, as ``optax.contrib.muon``
        orthogonalizes matrices; ``('matrix', 'embedding', 'vector')`` also normalizes embeddings per
        slice and vectors to unit norm); other leaves pass through.
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
      flops_per_byte: the plan's exchange rate of bytes through a collective for flops (a split
        matrix trades flops for Gram all-reduce bytes; docs/sharding.md, "The plan"). ``None``
        (default): the figure of the device kind of ``jax.devices()[0]``, peak flops over
        interconnect bandwidth from the vendor's spec sheet
        (``spectral_optax._distributed.plan.FLOPS_PER_BYTE_BY_KIND``).

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

    plan_args = (ns_coefficients, ns_steps, compute_dtype, ns_method, precision, flops_per_byte)

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
            if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(updates)):
                # eager, on sharded arrays: the plan's device views and shard_map run under jit only
                # (one compile per tree, dtypes and layouts: jax.jit's cache)
                return eager_update(updates, state)
            specs = [explicit_spec(x, x.ndim) for x in leaves]
            axes, replicas, plan = _within_replicas(groups, flat, mesh, axes, specs, plan_args)
            scale_of = lambda g: orthogonal_update_scale(g, scale)

            def run(*xs):
                with replica_groups(mesh_size(mesh, replicas)):
                    return run_plan(
                        groups, plan, xs, orthogonalize, scale_of, compute_dtype, ns_coefficients, specs, mesh, axes
                    )

        else:  # one device, inside shard_map, or distribute=False (XLA partitions the matmuls)
            run = lambda *xs: _run_batched(groups, xs, orthogonalize, scale)
        for (i, _), y in zip(members, keeping_specs(run, leaves, mesh)):
            out[i] = y
        return jax.tree_util.tree_unflatten(treedef, out), state

    eager_update = jax.jit(update_fn)
    update_fn = gathered(update_fn, axis_name)
    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


# --------------------------------------------------------------------------
# Grouping, the plan and batching (the distributed run: spectral_optax._distributed.execute).
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


def _plan(
    groups, flat, devices, coefficients, steps, compute_dtype, method, precision, flops_per_byte=None, blocks=()
) -> dict:
    """One :class:`~spectral_optax._distributed.plan.GroupPlan` per group (decided at trace time);
    ``blocks``: the trailing products of the device axes' sizes (:func:`_blocks`)."""
    fpb = default_flops_per_byte() if flops_per_byte is None else float(flops_per_byte)
    cdtype = jnp.dtype(compute_dtype) if compute_dtype is not None else jnp.dtype(default_compute_dtype())
    spec = resolve_coefficients(coefficients, steps, cdtype)  # 'auto': the iteration's dtype's
    n_steps = None if callable(spec) else len(spec[0])
    plans: dict[tuple[int, int], GroupPlan] = {}
    gram_plans: dict[tuple[int, int], GroupPlan] = {}
    methods: dict[tuple[int, int], str] = {}
    step_counts: dict[tuple[int, int], int | None] = {}
    power_starts: dict[tuple[int, int], bool] = {}
    auto = isinstance(coefficients, str) and coefficients.lower() == "auto"
    power = any_power = not callable(spec) and default_preconditioning(coefficients) == "power"
    for (m, n), members in groups.items():
        dtype = jnp.dtype(jnp.result_type(*[flat[i][1].dtype for i, _ in members]))
        move = min(dtype.itemsize, cdtype.itemsize) if n_steps else dtype.itemsize
        g_method, g_restarts = method, None
        if auto:  # the shape's own default schedule (auto_schedule), as newton_schulz runs it
            coef, auto_method, g_restarts = auto_schedule(m, n, cdtype)
            n_steps = len(resolve_coefficients(coef, steps, cdtype)[0])
            power = default_preconditioning(coef) == "power"
            any_power = any_power or power
            g_method = auto_method if method == "auto" else method
        whole = newton_schulz_method(m, n, n_steps, cdtype, g_method, precision) if n_steps else "standard"
        rs = gram_restarts(n_steps, cdtype, precision, g_restarts) if whole == "gram" and n_steps else ()
        methods[(m, n)] = whole
        step_counts[(m, n)], power_starts[(m, n)] = n_steps, power
        for table, gram_splits in ((plans, False), (gram_plans, True)):
            table[(m, n)] = plan_group(
                m, n, sum(g.num_slices for _, g in members), devices, steps=n_steps, method=whole,
                compute_itemsize=cdtype.itemsize, move_itemsize=move,
                paths=tuple(path_str(flat[i][0]) for i, _ in members), restarts=rs, flops_per_byte=fpb,
                power_start=power, gram_splits=gram_splits,
            )  # fmt: skip
    packed = pack_groups(
        plans, devices, steps=n_steps, compute_itemsize=cdtype.itemsize, whole_methods=methods, flops_per_byte=fpb,
        power_start=any_power,
    )  # fmt: skip
    return co_place(
        with_gram_splits(packed, gram_plans), devices, whole_methods=methods, flops_per_byte=fpb,
        steps=step_counts, compute_itemsize=cdtype.itemsize, power_start=power_starts, blocks=blocks,
    )  # fmt: skip


def _blocks(mesh, axes) -> tuple[int, ...]:
    """The products of the trailing sizes of ``axes`` in mesh order, the whole excluded: the device
    counts a group of consecutive devices may span as trailing axes of one view (``co_place``)."""
    sizes = dict(mesh.shape)
    out, size = [], 1
    for a in reversed(mesh_order(mesh, axes)[1:]):
        size *= sizes[a]
        out.append(size)
    return tuple(out)


def _within_replicas(groups, flat, mesh, axes, specs, plan_args):
    """``(axes, replica axes, plan)``: the plan within each replica group (the leading mesh axes no
    spec names, :func:`~spectral_optax._mesh.layout.replica_axes`) unless repeating the work in every
    group costs more than :data:`REPLICA_FLOPS_FACTOR` times the flops of spreading it over every
    device (a large data-parallel axis over small model groups), else over every axis of ``axes``."""
    replicas = replica_axes(mesh, axes, specs)
    every = _plan(groups, flat, mesh_size(mesh, axes), *plan_args, blocks=_blocks(mesh, axes))
    if replicas:
        inner = tuple(a for a in axes if a not in replicas)
        within = _plan(groups, flat, mesh_size(mesh, inner), *plan_args, blocks=_blocks(mesh, inner))
        flops = lambda plan: sum(g.flops for g in plan.values())
        if flops(within) <= REPLICA_FLOPS_FACTOR * flops(every):
            return inner, replicas, within
    return axes, (), every


def _run_batched(groups, leaves, orthogonalize, scale):
    """Every group as one batched call where it is (one device, shard_map blocks, or XLA's
    partitioning of every matmul with ``distribute=False``)."""
    out, it = [], iter(leaves)
    for members in groups.values():
        xs = [next(it) for _ in members]
        blocks = _batched([to_wide(x, g) for x, (_, g) in zip(xs, members)], orthogonalize)
        out.extend(_finish(b, g, scale, x.dtype) for b, x, (_, g) in zip(blocks, xs, members))
    return tuple(out)


def _finish(block, g: Geometry, scale, dtype):
    """``scale(g) * block`` (wide) back in the leaf's shape and dtype."""
    return from_wide(block, g, orthogonal_update_scale(g, scale), dtype)


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
    kinds: Sequence[str] = ("matrix",),
    precision: Any = None,
    flops_per_byte: float | None = None,
) -> OrthogonalizationPlan:
    """The plan :func:`~spectral_optax.orthogonalize_via_newton_schulz` follows for ``updates`` on ``devices`` devices.

    ``print(orthogonalization_plan(params))`` shows, for every group of
    same-shape matrices, the split ``k`` (devices sharing one matrix), the
    owner groups, the matrices per device and the predicted flops and bytes
    per device (the cost model and its formula: docs/sharding.md, "The plan").

    Args:
      updates: a tree of arrays or ``jax.ShapeDtypeStruct`` (shapes, dtypes and, for the device
        count, shardings as the updates will have them; parameters have the same).
      devices: number of devices the work is spread over; ``None``: every device of the mesh in
        the leaves' shardings, excluding ``Manual`` axes and, on ``Explicit`` meshes, leading axes
        no leaf is sharded over (a replica group's devices; 1 when there is no mesh).
      geometry: as in :func:`~spectral_optax.orthogonalize_via_newton_schulz`.
      ns_coefficients: as in :func:`~spectral_optax.orthogonalize_via_newton_schulz` (default ``'auto'``, as there).
      ns_steps: as in :func:`~spectral_optax.orthogonalize_via_newton_schulz`.
      compute_dtype: as in :func:`~spectral_optax.orthogonalize_via_newton_schulz`.
      ns_method: as in :func:`~spectral_optax.orthogonalize_via_newton_schulz`.
      kinds: as in :func:`~spectral_optax.orthogonalize_via_newton_schulz`.
      precision: as in :func:`~spectral_optax.orthogonalize_via_newton_schulz`.
      flops_per_byte: as in :func:`~spectral_optax.orthogonalize_via_newton_schulz`.

    Returns:
      An :class:`~spectral_optax.expert.OrthogonalizationPlan` (``str()`` prints the table).
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(updates)
    groups = _groups(flat, as_geometry_map(geometry), tuple(kinds))
    if devices is None:
        mesh = next((m for m in (aval_mesh(x) for _, x in flat) if m is not None), None)
        devices = 1
        if mesh is not None:
            axes = distribution_axes(mesh)
            specs = [getattr(getattr(x, "sharding", None), "spec", None) for _, x in flat if hasattr(x, "shape")]
            explicit = any(t == jax.sharding.AxisType.Explicit for t in getattr(mesh, "axis_types", ()))
            args = (ns_coefficients, ns_steps, compute_dtype, ns_method, precision, flops_per_byte)
            axes = _within_replicas(groups, flat, mesh, axes, specs if explicit else [None], args)[0]
            devices = mesh_size(mesh, axes)
    plans = _plan(groups, flat, devices, ns_coefficients, ns_steps, compute_dtype, ns_method, precision, flops_per_byte)
    return OrthogonalizationPlan(devices, tuple(plans.values()))
