"""Row-norm, column-norm and sign descent as optax GradientTransformations.

Each transform maps one dual of :mod:`spectral_optax._duals.row_column` over
the update tree through the parameter geometry: every leaf is viewed as its
canonical ``(num_slices, d_in, d_out)`` matrix (stacked layers, conv windows,
fused QKV blocks are handled by :func:`spectral_optax.expert.to_matrix`), normalized,
and reshaped back. The transforms are stateless and scale-invariant, so put
momentum before them and the learning rate after them.

References:
  docs/math.md section 3; Wong, Xu, Li, Lu (2026) (MOGA).
"""

from __future__ import annotations

import optax

from spectral_optax._duals.row_column import (
    check_p,
    check_q,
    column_direction,
    row_direction,
)
from spectral_optax._geometry import GeometryLike
from spectral_optax._mesh.layout import AxisName
from spectral_optax._transforms.dual import dual_map_transform

__all__ = ["scale_by_column_norm", "scale_by_row_norm", "scale_by_sign"]


def scale_by_row_norm(
    p: float = 2.0, *, geometry: GeometryLike = None, fan_scaling: bool = True, axis_name: AxisName = None
) -> optax.GradientTransformationExtraArgs:
    """Steepest descent under the (p,mean) -> inf operator norm (MOGA "row").

    For every output neuron ``i`` (fan-out index; a column of a Flax
    ``(in, out)`` kernel) of every batch slice, the fan-in vector ``g_i`` of
    the update becomes::

        sign(g_i) |g_i|^(p-1) / ||g_i||_p^(p-1) * d_in^(-1/p),

    the direction ``D`` maximizing ``<G, D>`` under
    ``||D||_{(p,mean)->inf} = d_in^(1/p) max_i ||d_i||_{p*} <= 1``.
    ``p = 1`` is ``sign(G) / d_in``; ``p = 2`` is l2 normalization of each
    fan-in vector times ``d_in^(-1/2)``. Vectors (``d_in = 1``) become
    ``sign(g)``; an embedding table is normalized on its canonical view
    (fan-in = vocabulary), which is rarely wanted: :func:`~spectral_optax.moga` routes
    embeddings to ``sign`` instead. All-zero vectors stay zero.

    Args:
      p: input norm exponent, ``1 <= p < inf``.
      geometry: anything :func:`spectral_optax.as_geometry_map` accepts
        (``None`` infers from Flax names; declare a fused QKV kernel with
        ``{r'qkv/kernel$': dict(kind='matrix', fan_out_splits=3)}``).
      fan_scaling: include the ``d_in^(-1/p)`` factor (False: unit ``l_{p*}``
        fan-in vectors, MOGA's output-head rule).
      axis_name: inside ``shard_map`` / ``pmap``, how the update blocks are
        sharded (see :func:`~spectral_optax.orthogonalize_via_newton_schulz`).

    Returns:
      A stateless ``optax.GradientTransformation``; dtypes are preserved
      (computed in float32 or wider).

    References:
      docs/math.md section 3; Wong, Xu, Li, Lu (2026).
    """
    check_p(p)
    return dual_map_transform(lambda m: row_direction(m, p, fan_scaling=fan_scaling), geometry, axis_name)


def scale_by_column_norm(
    q: float = 2.0, *, geometry: GeometryLike = None, fan_scaling: bool = True, axis_name: AxisName = None
) -> optax.GradientTransformationExtraArgs:
    """Steepest descent under the (1,mean) -> (q,mean) operator norm ("column").

    For every input index ``j`` (fan-in index; a row of a Flax kernel) of
    every batch slice, the fan-out vector ``h_j`` of the update becomes::

        sign(h_j) |h_j|^(q*-1) / ||h_j||_{q*}^(q*-1) * d_out^(1/q) / d_in,

    ``q* = q/(q-1)``: the direction maximizing ``<G, D>`` under
    ``||D||_{(1,mean)->(q,mean)} = d_in d_out^(-1/q) max_j ||d_j||_q <= 1``.
    ``q = inf`` is ``sign(G) / d_in``; ``q = 2`` gives every fan-out vector
    RMS ``1/d_in``. ``d_out`` is per fused block (``fan_out_splits``).

    Args:
      q: output norm exponent, ``1 < q <= inf``.
      geometry: see :func:`~spectral_optax.scale_by_row_norm`.
      fan_scaling: include the ``d_out^(1/q) / d_in`` factor.
      axis_name: see :func:`~spectral_optax.scale_by_row_norm`.

    Returns:
      A stateless ``optax.GradientTransformation``.

    References:
      docs/math.md section 3; Wong, Xu, Li, Lu (2026).
    """
    check_q(q)
    return dual_map_transform(lambda m: column_direction(m, q, fan_scaling=fan_scaling), geometry, axis_name)


def scale_by_sign() -> optax.GradientTransformationExtraArgs:
    """``u -> sign(u)`` elementwise (steepest descent in the max-entry norm;
    MOGA's rule for embeddings and 1-D parameters). Dtypes preserved; extra
    keyword arguments of ``update`` are accepted and ignored."""
    return optax.with_extra_args_support(optax.scale_by_sign())
