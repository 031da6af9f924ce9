"""Relative changes, norms, stable rank and alignment of features and weights (docs/math.md section 2)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_optax._geometry import (
    Geometry,
    GeometryLike,
    map_with_geometry,
    to_matrix,
)
from spectral_optax._numerics import safe_max_abs, safe_norm, top_singular_value


def _f32(x):
    x = jnp.asarray(x)
    return x.astype(jnp.float32) if x.dtype != jnp.float64 else x


def relative_change(new, old, eps: float = 1e-30) -> jax.Array:
    """``||new - old||_F / ||old||_F`` (0 when both are 0, inf when only old is).

    Computed in float32 (float64 inputs stay float64), without overflow.

    Args:
      new: the changed array (any shape; the norms run over all entries).
      old: the reference array, of the same shape.
      eps: a norm at or below ``eps`` counts as 0: ``||old||_F <= eps`` gives
        0 when also ``||new - old||_F <= eps`` and inf otherwise.

    Returns:
      a scalar.
    """
    new, old = _f32(new), _f32(old)
    num = safe_norm(new - old)
    den = safe_norm(old)
    return jnp.where(den > eps, num / jnp.maximum(den, eps), jnp.where(num > eps, jnp.inf, 0.0))


def relative_feature_change(features_new, features_old) -> Any:
    """``||dh|| / ||h||`` per feature: :func:`relative_change` on each leaf.

    Args:
      features_new: the activations after training, a tree (e.g. a dict by
        layer name of ``(batch, width)`` arrays); each leaf's Frobenius norm
        runs over the whole batch.
      features_old: the activations before training on the same inputs, a
        tree of the same structure.

    Returns:
      a tree of scalars with the structure of ``features_new``.
    """
    return jax.tree.map(relative_change, features_new, features_old)


def _as_geometry(x, geometry: Geometry | None) -> Geometry:
    if geometry is not None:
        return geometry
    shape = tuple(np.shape(x))
    if len(shape) < 2:
        return Geometry.vector(shape)
    return Geometry.matrix(shape)


def spectral_norm(x, geometry: Geometry | None = None, *, method: str = "auto", iters: int = 100) -> jax.Array:
    """``||W||_*`` (largest singular value) of the canonical matrix view.

    Several slices (stacked layers, heads): the maximum over slices.

    Args:
      x: the parameter (or update).
      geometry: its :class:`~spectral_optax.Geometry`; default: a matrix with
        fan-in axis -2 and fan-out axis -1 (a vector for < 2 dims).
      method: ``'svd'`` (exact), ``'power'`` (``iters`` power iterations, for
        large matrices) or ``'auto'`` (SVD up to min dimension 1024).
      iters: number of power iterations (cold-started, on the shorter side);
        used only when the power method runs.
    """
    m = to_matrix(_f32(x), _as_geometry(x, geometry))
    return jnp.max(top_singular_value(m, method, iters))


def frobenius_norm(x) -> jax.Array:
    """``||W||_F``, the square root of the sum of squared entries (no overflow).

    Args:
      x: an array of any shape; computed in float32 (float64 stays float64).
    """
    return safe_norm(_f32(x))


def stable_rank(x, geometry: Geometry | None = None, *, method: str = "auto") -> jax.Array:
    """``||W||_F^2 / ||W||_*^2`` of the matrix view (per slice; the mean over slices).

    Between 1 (rank one) and ``min(d_in, d_out)`` (all singular values
    equal); scale-invariant.

    Args:
      x: the parameter (or update).
      geometry: its :class:`~spectral_optax.Geometry`; default: a matrix with
        fan-in axis -2 and fan-out axis -1 (a vector for < 2 dims).
      method: how ``||W||_*`` is computed, as in :func:`spectral_norm`
        (100 power iterations for ``'power'``).
    """
    m = to_matrix(_f32(x), _as_geometry(x, geometry))
    m = m / safe_max_abs(m, axis=(-2, -1))  # scale-invariant; avoids overflow
    top = top_singular_value(m, method, 100)
    fro2 = jnp.sum(m**2, axis=(-2, -1))
    return jnp.mean(fro2 / jnp.maximum(top**2, 1e-30))


def relative_weight_change(
    new, old, *, norm: str = "spectral", geometry: GeometryLike = None, method: str = "auto"
) -> Any:
    """``||W_new - W_old|| / ||W_old||`` per parameter.

    Args:
      new, old: parameter trees (or single arrays) of equal structure.
      norm: ``'spectral'`` (largest singular value of the canonical matrix
        view, max over slices) or ``'frobenius'``.
      geometry: geometry overrides for trees (see
        :func:`spectral_optax.as_geometry_map`), or a
        :class:`~spectral_optax.Geometry` for a single array.
      method: spectral-norm method, see :func:`spectral_norm`.

    Returns:
      a tree of scalars with the structure of ``new`` (a scalar for arrays).
    """
    if norm not in ("spectral", "frobenius"):
        raise ValueError(f"norm must be 'spectral' or 'frobenius', got {norm!r}")

    def one(g, a, b):
        if norm == "frobenius":
            return relative_change(a, b)
        num = spectral_norm(_f32(a) - _f32(b), g, method=method)
        den = spectral_norm(b, g, method=method)
        return num / jnp.maximum(den, 1e-30)

    if hasattr(new, "shape") and hasattr(old, "shape"):
        g = geometry if isinstance(geometry, Geometry) else _as_geometry(new, None)
        return one(g, new, old)
    return map_with_geometry(one, geometry, new, old)


def alignment(f, w_out, h) -> jax.Array:
    """Final-layer alignment ``|f| / (||w_out|| ||h||)``, averaged over the batch.

    1 means the read-out vector points along the features (a low-rank,
    aligned update: what feature learning produces); ~``1/sqrt(n)`` means
    random alignment.

    Args:
      f: outputs ``(batch,)`` or ``(batch, 1)``.
      w_out: read-out weights ``(n,)`` or ``(n, 1)``.
      h: last hidden features ``(batch, n)``.
    """
    f = _f32(f).reshape(-1)
    h = _f32(h).reshape(f.shape[0], -1)
    wn = safe_norm(_f32(w_out))
    hn = safe_norm(h, axis=-1)
    return jnp.mean(jnp.abs(f) / jnp.maximum(wn * hn, 1e-30))
