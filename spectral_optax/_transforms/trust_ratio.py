"""``scale_by_spectral_trust_ratio``: LARS / LAMB trust ratios that meet the spectral condition.

LARS (You, Gitman, Ginsburg 2017) and LAMB (You et al. 2020) rescale each
layer's update ``U_l`` to a fixed fraction of the weight in Frobenius norm:

    U_l <- eta * ||W_l||_F / ||U_l||_F * U_l        (so ||dW_l||_F / ||W_l||_F = eta).

A random initialization spreads ``||W_l||_F`` over ``k_l = min(d_in, d_out)``
comparable singular values (``||W_l||_F ~ sqrt(k_l) ||W_l||_*``), while a
gradient is close to low rank (``||dW_l||_F ~ ||dW_l||_*``). A fixed
Frobenius ratio therefore gives a spectral ratio

    ||dW_l||_* / ||W_l||_*  ~  eta * sqrt(min(d_in, d_out)),

which grows with width. The spectral condition asks for ``Theta(1)``; the
correction of Yang, Simon, Bernstein (2023) divides the trust ratio by
``sqrt(min(d_in, d_out))``:

    U_l <- eta * ||W_l||_F / (sqrt(min(d_in, d_out)) * ||U_l||_F) * U_l.

Per leaf, on the canonical view ``(num_slices, d_in, d_out)`` of its
:class:`~spectral_optax.Geometry`, one ratio per slice (stacked layers and
fused QKV blocks are independent matrices). ``min(d_in, d_out)`` uses the
effective input width (1 for embeddings and vectors, whose inputs are
one-hot or constant), so biases and embedding tables get the plain LARS
ratio. ``rule='lars'`` drops the ``sqrt(min(d_in, d_out))`` and reproduces
plain LARS (per slice; on a 2-D kernel it equals ``optax.scale_by_trust_ratio``).

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning",
  the discussion of LARS and LAMB. You, Gitman, Ginsburg (2017), "Large Batch
  Training of Convolutional Networks" (LARS). You et al. (2020), "Large Batch
  Optimization for Deep Learning: Training BERT in 76 minutes" (LAMB).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import optax

from spectral_optax._geometry import Geometry, GeometryLike, as_geometry_map, from_matrix, map_with_geometry, to_matrix
from spectral_optax._numerics import compute_dtype, safe_norm

RULES = ("spectral", "lars")


def _slice_norms(m):
    """Frobenius norm of each slice of ``(slices, d_in, d_out)``, shape ``(slices, 1, 1)`` (overflow-safe)."""
    return safe_norm(m, axis=(-2, -1))[:, None, None]


def trust_ratio_width(geometry: Geometry, rule: str) -> int:
    """``k`` in the ratio ``||W||_F / (sqrt(k) ||U||_F)``: ``min(input_width, d_out)``
    for ``rule='spectral'``, 1 for ``rule='lars'``."""
    if rule == "lars":
        return 1
    if rule == "spectral":
        return max(1, min(geometry.input_width, geometry.d_out))
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def scale_by_spectral_trust_ratio(
    *,
    rule: str = "spectral",
    trust_coefficient: float = 1.0,
    min_norm: float = 0.0,
    eps: float = 0.0,
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """Per-layer trust ratio; ``rule='spectral'`` meets the spectral condition.

    Each slice ``U`` of an update, with the matching slice ``W`` of the
    parameters, becomes

        U * trust_coefficient * max(||W||_F, min_norm) / (sqrt(k) * (max(||U||_F, min_norm) + eps)),

    ``k = min(d_in, d_out)`` for ``rule='spectral'`` (``||dW||_F`` proportional
    to ``||W||_F / sqrt(min(d_in, d_out))``: the spectral ratio
    ``||dW||_* / ||W||_*`` stays Theta(1) at every width) and ``k = 1`` for
    ``rule='lars'`` (plain LARS, whose spectral ratio grows like
    ``sqrt(min(d_in, d_out))``). As in ``optax.scale_by_trust_ratio``, a slice
    whose parameter or update norm is 0 is passed through unchanged (ratio 1).
    Stateless (``optax.EmptyState``).

    LARS: ``optax.chain(scale_by_spectral_trust_ratio(), optax.scale(-lr))``
    (optionally after ``optax.trace`` for momentum); LAMB:
    ``optax.chain(optax.scale_by_adam(), scale_by_spectral_trust_ratio(),
    optax.scale(-lr))``.

    Args:
      rule: ``'spectral'`` (the corrected rule, default) or ``'lars'``.
      trust_coefficient: the target ratio ``eta`` (``||dW||_F / ||W||_F``
        times ``sqrt(k)``); the learning rate multiplies it.
      min_norm: floor of both norms (``optax.scale_by_trust_ratio``'s meaning).
      eps: added to the update norm.
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.

    Returns:
      An ``optax.GradientTransformation`` whose ``update`` needs ``params``.

    References:
      Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature
      Learning"; You, Gitman, Ginsburg (2017) (LARS); You et al. (2020) (LAMB).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    for name, value in (("trust_coefficient", trust_coefficient), ("min_norm", min_norm), ("eps", eps)):
        if isinstance(value, (int, float)) and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    gmap = as_geometry_map(geometry)

    def leaf(path, g: Geometry, u, w):
        if w is None or not hasattr(w, "shape") or tuple(w.shape) != tuple(u.shape):
            raise ValueError(
                f"scale_by_spectral_trust_ratio: parameter '{path}' has shape "
                f"{getattr(w, 'shape', None)} but its update has shape {u.shape}; pass the current "
                "params with the same tree structure: tx.update(grads, state, params)"
            )
        m_u, m_w = to_matrix(u, g), to_matrix(w, g)
        m_u = m_u.astype(compute_dtype(m_u))
        raw_u = _slice_norms(m_u)
        w_norm = jnp.maximum(_slice_norms(m_w), min_norm)
        u_norm = jnp.maximum(raw_u, min_norm)
        k = trust_ratio_width(g, rule)
        # u * c ||W|| / (sqrt(k) (||u|| + eps)), evaluated as unit(u) * (c ||W|| / sqrt(k)) *
        # (||u||_raw / (||u|| + eps)): every factor is finite for finite input (no 1e30 / 1e-30).
        direction = m_u / jnp.where(raw_u > 0, raw_u, 1.0)
        size = trust_coefficient * w_norm / math.sqrt(k) * (raw_u / jnp.where(u_norm + eps > 0, u_norm + eps, 1.0))
        out = jnp.where((w_norm == 0) | (u_norm == 0), m_u, direction * size)
        return from_matrix(out.astype(u.dtype), g)

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError(
                "scale_by_spectral_trust_ratio needs the parameters (the ratio is ||W|| / ||U|| per "
                "layer): call tx.update(grads, state, params)"
            )
        return map_with_geometry(leaf, gmap, updates, params, with_path=True, skip_empty=True), state

    return optax.with_extra_args_support(optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn))
