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
from jax.experimental.shard_alike import shard_alike
from jax.sharding import PartitionSpec as P

from spectral_optax._duals.polar import (
    PRECONDITIONINGS,
    Coefficients,
    newton_schulz,
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
from spectral_optax._sharding import (
    AxisName,
    aval_mesh,
    distribution_axes,
    explicit_spec,
    gathered,
    is_explicit,
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
    ``N`` devices that batch is split over all of them: each device
    orthogonalizes about ``1/N`` of the whole matrices (one all-to-all to
    bring them, one to return the results to the parameters' shardings); a
    leaf sharded only along its batch (stacked-layer) axes, or whose slice
    count is a multiple of ``N``, is kept in place. A zero update stays zero; the
    result has the update's dtype (the iteration runs in ``compute_dtype``).

    Args:
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.
      scale: ``'spectral'`` (default, ``sqrt(d_out / d_in)``), ``'muon'``
        (``sqrt(max(1, d_out / d_in))``), ``'rms'`` (``0.2 sqrt(max(d_in,
        d_out))``), a number or a function ``geometry -> number``.
      ns_coefficients: ``'auto'`` (default: ``'quintic'`` for float32
        compute, ``'polar_express_schatten'`` for bfloat16 / float16),
        ``'quintic'`` (Muon's, 5 steps), ``'polar_express'`` (8 steps by
        default), ``'polar_express_schatten'`` (4 steps), ``'you'`` (5
        steps), an ``(a, b, c)`` triple, a table or a function ``(batch,
        d_in, d_out) -> (batch, d_in, d_out)`` replacing the iteration; see
        :func:`spectral_optax.newton_schulz`.
      ns_steps: number of Newton-Schulz steps (default from ``coefficients``).
      compute_dtype: dtype of the iteration; ``None``: float32 on CPU,
        bfloat16 on GPU/TPU.
      ns_method: ``'auto'`` | ``'standard'`` | ``'gram'`` (Gram-space iteration for
        rectangular matrices; ``'auto'`` uses it in float32 and float16 when it
        saves flops, see :func:`spectral_optax.newton_schulz_method`).
      norm_safety: Frobenius-normalization safety factor (default per schedule).
      kinds: geometry kinds to orthogonalize; other leaves pass through.
        (For a vector, ``d_in = 1`` and ``U V^T`` is the vector scaled to
        unit norm, i.e. ``sqrt(d_out)`` times RMS 1 under ``'spectral'``.)
      precision: ``jax.lax.Precision`` of the matmuls.
      distribute: spread whole matrices over the devices of the updates'
        mesh (jit with ``NamedSharding``; see docs/sharding.md). ``None``
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
        ``'schatten'`` or ``'aol'``: the scaling of the iteration's start, see
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

    def orthogonalize(stacked):
        return newton_schulz(
            stacked,
            ns_coefficients,
            steps=ns_steps,
            compute_dtype=compute_dtype,
            method=ns_method,
            norm_safety=norm_safety,
            precision=precision,
            preconditioning=ns_preconditioning,
        )

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
        idx = [i for i, (_, x) in enumerate(flat) if hasattr(x, "shape")]
        geoms = gmap.resolve([path_str(flat[i][0]) for i in idx], [tuple(np.shape(flat[i][1])) for i in idx])
        out = [x for _, x in flat]
        meshes = (aval_mesh(out[i]) for i, g in zip(idx, geoms) if g.kind in kinds)
        mesh = next((m for m in meshes if m is not None), None)
        axes = distribution_axes(mesh)
        # Group same-shape canonical matrices across the tree, tall ones transposed
        # (NS(G^T) = NS(G)^T), so (256, 1024) and (1024, 256) share a batch. On Auto meshes,
        # whose layouts are not in the types, only leaves of one shape and geometry are batched
        # together (the best available proxy for one layout).
        mixed_ok = not axes or is_explicit(mesh, axes)
        groups: dict[tuple, list[tuple[int, Geometry]]] = {}
        for i, g in zip(idx, geoms):
            if g.kind in kinds and flat[i][1].size:
                key = (min(g.d_in, g.d_out), max(g.d_in, g.d_out)) if mixed_ok else (g,)
                groups.setdefault(key, []).append((i, g))
        for members in groups.values():
            if axes and distribute is not False:
                results = _distributed(members, out, mesh, axes, orthogonalize)
            elif axes and is_explicit(mesh, axes):  # XLA partitions the matmuls (needs Auto axes)
                results = _on_auto_axes(members, out, mesh, axes, orthogonalize)
            else:
                results = _batched([_wide(out[i], g) for i, g in members], orthogonalize)
            for (i, g), block in zip(members, results):
                out[i] = _finish(block, g, scale, out[i].dtype)
        return jax.tree_util.tree_unflatten(treedef, out), state

    update_fn = gathered(update_fn, axis_name)
    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


# --------------------------------------------------------------------------
# Batching and distribution.
# --------------------------------------------------------------------------
def _wide(x, g: Geometry):
    """The canonical view ``(num_slices, d_in, d_out)``, transposed to ``m <= n``."""
    m = to_matrix(x, g)
    return jnp.swapaxes(m, 1, 2) if g.d_in > g.d_out else m


def _finish(block, g: Geometry, scale, dtype):
    """``scale(g) * block`` back in the leaf's shape and dtype."""
    if g.d_in > g.d_out:
        block = jnp.swapaxes(block, 1, 2)
    factor = orthogonal_update_scale(g, scale)
    block = (block.astype(jnp.promote_types(block.dtype, jnp.float32)) * factor).astype(dtype)
    return from_matrix(block, g)


def _batched(mats, orthogonalize, pad_to: int = 1, constrain=None):
    """Concatenate ``mats`` on the slice axis (zero-padded to a multiple of
    ``pad_to``), orthogonalize once, split back."""
    dtype = jnp.result_type(*mats)
    mats = [m.astype(dtype) for m in mats]
    total = sum(m.shape[0] for m in mats)
    pad = -total % pad_to
    if pad:
        mats = mats + [jnp.zeros((pad,) + mats[0].shape[1:], dtype)]
    stacked = mats[0] if len(mats) == 1 else jnp.concatenate(mats, axis=0)
    if constrain is not None:
        stacked = constrain(stacked)
    ortho = orthogonalize(stacked)
    if constrain is not None:
        ortho = constrain(ortho)
    if len(mats) == 1:
        return [ortho]
    blocks, start = [], 0
    for m in mats[: len(mats) - (1 if pad else 0)]:
        blocks.append(ortho[start : start + m.shape[0]])
        start += m.shape[0]
    return blocks


def _in_place(x, g: Geometry, spec) -> bool:
    """True when the leaf's known spec shards its batch axes only (so its slices are local)."""
    if spec is None:
        return False
    matrix_axes = set(g.fan_in_axes) | set(g.fan_out_axes)
    sharded = [d for d, entry in enumerate(spec) if spec_axes(entry)]
    return bool(sharded) and not any(d in matrix_axes for d in sharded)


def _wide_spec(spec, g: Geometry):
    """The ``PartitionSpec`` of the wide canonical view ``(slices, m, n)`` of a leaf with ``spec``,
    or ``None`` when it is not a plain one (several sharded fan-in / fan-out axes, fused blocks)."""
    if spec is None:
        return None
    entry = lambda axes_: [spec[a] for a in axes_ if spec_axes(spec[a])]
    fan_in, fan_out, batch = entry(g.fan_in_axes), entry(g.fan_out_axes), entry(g.batch_axes)
    if len(fan_in) > 1 or len(fan_out) > 1 or batch or (fan_out and g.fan_out_splits > 1):
        return None
    rows, cols = (fan_in or [None])[0], (fan_out or [None])[0]
    if g.d_in > g.d_out:
        rows, cols = cols, rows
    return P(None, rows, cols)


def _distributed(members, out, mesh, axes, orthogonalize):
    """Orthogonalize a same-shape group with each device owning ~1/N of the matrices.

    The wide views of the group's leaves are stacked to ``(B, m, n)``
    (zero-padded to a multiple of ``N``) and constrained to ``P(axes, None,
    None)``: XLA moves every matrix whole to its owner (one all-to-all from
    FSDP / tensor-parallel layouts), each device runs the iteration on its own
    matrices, and the stack is constrained back to the leaves' common layout
    (one all-to-all) before it is split, so every leaf keeps its sharding. On
    ``Explicit`` meshes the layouts are read from the types and the shuffle
    runs under ``jax.sharding.auto_axes`` with each leaf's ``PartitionSpec``
    as its output sharding. On ``Auto`` meshes the layouts are not in the
    types: the result stack is constrained to an unsplit batch axis with
    unconstrained matrix axes, so XLA brings each matrix back (one
    all-to-all) in the layout it propagates from the parameters (same-shape
    leaves of different layouts may come back in one of them).
    """
    explicit = is_explicit(mesh, axes)
    specs = [explicit_spec(out[i], out[i].ndim) if explicit else None for i, _ in members]
    results: list[Any] = [None] * len(members)

    # Leaves already sharded along batch (stacked-layer) axes only: no communication.
    subgroups: dict[Any, list[int]] = {}
    for k, ((i, g), spec) in enumerate(zip(members, specs)):
        if _in_place(out[i], g, spec):
            results[k] = orthogonalize(_wide(out[i], g))
        else:
            key = _wide_spec(spec, g) if explicit else None
            subgroups.setdefault(key, []).append(k)

    def named(spec):
        return spec if explicit else jax.sharding.NamedSharding(mesh, spec)

    for layout, ks in subgroups.items():
        owners = _owner_axes(mesh, axes, sum(members[k][1].num_slices for k in ks))
        n_dev = mesh_size(mesh, owners)
        batch_spec = P(owners if len(owners) > 1 else (owners[0] if owners else None), None, None)

        def shuffle(*leaves, ks=ks, layout=layout, n_dev=n_dev, batch_spec=batch_spec):
            mats = [_wide(x, members[k][1]) for x, k in zip(leaves, ks)]
            dtype = jnp.result_type(*mats)
            stacked = jnp.concatenate([m.astype(dtype) for m in mats], axis=0) if len(mats) > 1 else mats[0]
            if layout is not None:
                stacked = jax.lax.with_sharding_constraint(stacked, named(layout))
            total = stacked.shape[0]
            pad = -total % n_dev
            owned = jnp.pad(stacked, ((0, pad), (0, 0), (0, 0))) if pad else stacked
            owned = jax.lax.with_sharding_constraint(owned, named(batch_spec))
            ortho = jax.lax.with_sharding_constraint(orthogonalize(owned), named(batch_spec))
            ortho = ortho[:total] if pad else ortho
            if layout is not None:
                ortho = jax.lax.with_sharding_constraint(ortho, named(layout))
            else:  # layouts unknown (Auto): batch axis whole, matrix axes as XLA propagates them
                free = P.UNCONSTRAINED
                ortho = jax.lax.with_sharding_constraint(ortho, named(P(None, free, free)))
            blocks, start = [], 0
            for x, k in zip(leaves, ks):
                g = members[k][1]
                block = _back(ortho[start : start + g.num_slices], g)
                start += g.num_slices
                if layout is None:  # Auto: each result in its input's layout
                    block, _ = shard_alike(block, x)
                blocks.append(block)
            return tuple(blocks)

        leaves = [out[members[k][0]] for k in ks]
        if explicit:
            out_specs = tuple(specs[k] if specs[k] is not None else P() for k in ks)
            with jax.sharding.use_abstract_mesh(mesh):
                done = jax.sharding.auto_axes(shuffle, axes=axes, out_sharding=out_specs)(*leaves)
        else:
            done = shuffle(*leaves)
        for k, block in zip(ks, done):
            results[k] = _wide(block, members[k][1])
    return results


def _back(block, g: Geometry):
    """Wide ``(num_slices, m, n)`` block -> the leaf's shape (unscaled)."""
    if g.d_in > g.d_out:
        block = jnp.swapaxes(block, 1, 2)
    return from_matrix(block, g)


def _owner_axes(mesh, axes, num_matrices: int) -> tuple[str, ...]:
    """The mesh axes a batch of ``num_matrices`` is spread over: the subset of
    ``axes`` with the most devices ``n <= num_matrices`` (ties: least padding).
    A batch smaller than every axis is computed whole on every device."""
    best: tuple[int, int, tuple[str, ...]] = (1, 0, ())
    for mask in range(1, 1 << len(axes)):
        subset = tuple(a for j, a in enumerate(axes) if mask >> j & 1)
        n = mesh_size(mesh, subset)
        if n <= num_matrices and (n, -(-num_matrices % n)) > best[:2]:
            best = (n, -(-num_matrices % n), subset)
    return best[2]


def _on_auto_axes(members, out, mesh, axes, orthogonalize):
    """``distribute=False`` on an ``Explicit`` mesh: the batched iteration under
    ``jax.sharding.auto_axes`` (XLA partitions each matmul, as on ``Auto``
    meshes), every result in its leaf's ``PartitionSpec``."""
    leaves = [out[i] for i, _ in members]
    specs = tuple(explicit_spec(x, x.ndim) or P() for x in leaves)

    def run(*xs):
        blocks = _batched([_wide(x, g) for x, (_, g) in zip(xs, members)], orthogonalize)
        return tuple(_back(b, g) for b, (_, g) in zip(blocks, members))

    with jax.sharding.use_abstract_mesh(mesh):
        done = jax.sharding.auto_axes(run, axes=axes, out_sharding=specs)(*leaves)
    return [_wide(x, g) for x, (_, g) in zip(done, members)]
