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

from spectral_optax._duals.polar import (
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
    ns_coefficients: Coefficients = "quintic",
    ns_steps: int | None = None,
    compute_dtype: Any = None,
    ns_method: str = "auto",
    norm_safety: float | None = None,
    kinds: Sequence[str] = KINDS,
    precision: Any = None,
) -> optax.GradientTransformation:
    """Replace every update by ``scale * U V^T`` per batch slice (steepest descent in RMS->RMS).

    For each leaf of geometry ``g`` and each slice ``G`` of its canonical view
    ``to_matrix(update, g)`` of shape ``(d_in, d_out)``::

        update <- scale(g) * NS(G) ~ scale(g) * U V^T,    G = U S V^T.

    Same-shape matrices across the tree are processed as one batched
    :func:`~spectral_optax.newton_schulz` call. A zero update stays zero; the
    result has the update's dtype (the iteration runs in ``compute_dtype``).

    Args:
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.
      scale: ``'spectral'`` (default, ``sqrt(d_out / d_in)``), ``'muon'``
        (``sqrt(max(1, d_out / d_in))``), ``'rms'`` (``0.2 sqrt(max(d_in,
        d_out))``), a number or a function ``geometry -> number``.
      ns_coefficients: ``'quintic'`` (Muon's, 5 steps), ``'polar_express'``
        (8 steps by default), an ``(a, b, c)`` triple, a table or a function
        ``(batch, d_in, d_out) -> (batch, d_in, d_out)`` replacing the
        iteration; see :func:`spectral_optax.newton_schulz`.
      ns_steps: number of Newton-Schulz steps (default from ``coefficients``).
      compute_dtype: dtype of the iteration; ``None``: float32 on CPU,
        bfloat16 on GPU/TPU.
      ns_method: ``'auto'`` | ``'standard'`` | ``'gram'`` (Gram-space iteration for
        rectangular matrices; ``'auto'`` uses it in float32 when it saves flops).
      norm_safety: Frobenius-normalization safety factor (default per schedule).
      kinds: geometry kinds to orthogonalize; other leaves pass through.
        (For a vector, ``d_in = 1`` and ``U V^T`` is the vector scaled to
        unit norm, i.e. ``sqrt(d_out)`` times RMS 1 under ``'spectral'``.)
      precision: ``jax.lax.Precision`` of the matmuls.

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
    resolve_coefficients(ns_coefficients, ns_steps)  # validate at construction
    gmap = as_geometry_map(geometry)
    kinds = tuple(kinds)

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
        idx = [i for i, (_, x) in enumerate(flat) if hasattr(x, "shape")]
        geoms = gmap.resolve(
            [path_str(flat[i][0]) for i in idx], [tuple(np.shape(flat[i][1])) for i in idx]
        )
        # Group same-shape canonical matrices across the tree.
        groups: dict[tuple[int, int], list[tuple[int, Geometry]]] = {}
        for i, g in zip(idx, geoms):
            if g.kind in kinds and flat[i][1].size:
                groups.setdefault((g.d_in, g.d_out), []).append((i, g))
        out = [x for _, x in flat]
        for members in groups.values():
            mats = [to_matrix(out[i], g) for i, g in members]
            dtype = jnp.result_type(*mats)
            stacked = mats[0] if len(mats) == 1 else jnp.concatenate(
                [m.astype(dtype) for m in mats], axis=0
            )
            ortho = newton_schulz(
                stacked,
                ns_coefficients,
                steps=ns_steps,
                compute_dtype=compute_dtype,
                method=ns_method,
                norm_safety=norm_safety,
                precision=precision,
            )
            start = 0
            for i, g in members:
                block = ortho[start : start + g.num_slices]
                start += g.num_slices
                factor = orthogonal_update_scale(g, scale)
                leaf_dtype = out[i].dtype
                block = (block.astype(jnp.promote_types(block.dtype, jnp.float32)) * factor).astype(
                    leaf_dtype
                )
                out[i] = from_matrix(block, g)
        return jax.tree_util.tree_unflatten(treedef, out), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)
