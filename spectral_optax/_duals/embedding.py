"""The l1 -> RMS dual map (embeddings) and the vector rule.

An embedding table is fed one-hot inputs (``||x||_1 = 1``), so its operator
norm ``l1 -> RMS`` is the largest RMS of a token's fan-out vector. The
steepest-descent direction in that norm scales each token's fan-out vector
to RMS 1:

    D[j, :] = G[j, :] / RMS(G[j, :])          for every fan-in index j.

A vector parameter (bias, norm scale) is a matrix fed by a constant input of
width 1: the same formula with a single fan-in index, i.e. the whole vector
is scaled to RMS 1, which is spectral norm ``sqrt(d_out)`` = the spectral
condition's target ``sqrt(d_out / 1)``.

References:
  Large et al. (2024), "Scalable Optimization in the Modular Norm" (Embed);
  Pethick et al. (2025), "Training Deep Learning Models with Norm-Constrained
  LMOs" (Scion ColNorm). docs/math.md section 3.
"""

from __future__ import annotations

import jax

from spectral_optax._numerics import rms_normalize


def normalize_fan_out_rms(m: jax.Array, *, axis_name=None) -> jax.Array:
    """Scale every fan-in index's fan-out vector to RMS 1.

    Args:
      m: the canonical view ``(num_slices, d_in, d_out)`` of a gradient.
      axis_name: inside ``shard_map``, the mesh axes splitting the fan-out
        axis (axis 2); the RMS is reduced over them. ``None``: ``m`` is whole.

    Returns:
      ``m[s, j, :] / RMS(m[s, j, :])`` in ``m``'s dtype; all-zero rows stay
      zero (no NaN), magnitudes from 1e-30 to 1e30 stay finite.
    """
    return rms_normalize(m, axis=-1, axis_name=axis_name).astype(m.dtype)
