"""``scale_by_neuron_second_moment``: NorMuon's neuron-wise normalization of an orthogonal update.

For every slice ``O`` (shape ``(d_in, d_out)``, the canonical view) of an
update that has already been orthogonalized, with ``j`` the output neuron
(fan-out index)::

    v_t[j] = beta v_{t-1}[j] + (1 - beta) mean_i O[i, j]^2
    O'     = O / (sqrt(v_t) + eps)                         (per column j)
    out    = scale(g) * (||O||_F / ||O'||_F) * O'

The second moment per neuron evens out the row norms the orthogonalization
leaves unequal; the Frobenius rescale keeps the update's size that of
``O`` (so ``scale='rms'`` gives NorMuon's ``0.2 sqrt(m n) / ||O'||_F``
when ``O`` is exactly orthogonal). See docs/math.md, "Orthogonalization at fewer flops".

References:
  Z. Li, L. Liu, C. Liang, W. Chen, T. Zhao (2025), "NorMuon: Making Muon more
  efficient and scalable", arXiv:2510.05491 (Algorithm 1).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from spectral_optax._geometry import (
    GeometryLike,
    as_geometry_map,
    path_str,
)
from spectral_optax._mesh.layout import replicated_on_mesh_of
from spectral_optax._transforms.dual import on_canonical_view
from spectral_optax._transforms.orthogonalize import orthogonal_update_scale

__all__ = ["ScaleByNeuronSecondMomentState", "scale_by_neuron_second_moment"]


class ScaleByNeuronSecondMomentState(NamedTuple):
    """State of :func:`~spectral_optax.scale_by_neuron_second_moment`.

    Attributes:
      nu: per leaf, the EMA of the mean square of every output neuron,
        shape ``(num_slices, d_out)``, float32 (float64 for float64 leaves).
    """

    nu: Any


def _leaves_with_geometry(tree, gmap):
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    geoms = gmap.resolve([path_str(p) for p, _ in flat], [tuple(jnp.shape(x)) for _, x in flat])
    return [x for _, x in flat], geoms, treedef


def scale_by_neuron_second_moment(
    beta: float = 0.95,
    eps: float = 1e-8,
    *,
    scale: Any = "spectral",
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """Normalize every output neuron of an orthogonalized update by its second moment (NorMuon).

    Per slice ``O`` of the canonical view ``(d_in, d_out)``, column ``j`` the
    output neuron: ``v <- beta v + (1 - beta) mean_i O_ij^2``, ``O' = O /
    (sqrt(v) + eps)``, and the result ``scale(g) ||O||_F / ||O'||_F O'`` (a
    zero slice stays zero). Apply it to the unscaled orthogonal factor, e.g.
    after ``orthogonalize_via_newton_schulz(scale=1.0)``; :func:`spectral_optax.normuon`
    does.

    Args:
      beta: EMA coefficient of the neuron second moments (NorMuon's
        ``beta_2``).
      eps: added to ``sqrt(v)``.
      scale: the factor of the result, as in
        :func:`spectral_optax.orthogonalize_via_newton_schulz` (``'spectral'``
        ``sqrt(d_out / d_in)``, ``'muon'``, ``'rms'`` ``0.2 sqrt(max(d_in,
        d_out))``, a number or a function ``geometry -> number``).
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` with state
      :class:`~spectral_optax.expert.ScaleByNeuronSecondMomentState`.
    """
    if isinstance(beta, (int, float)) and not 0 <= beta < 1:  # (traced under inject_hyperparams)
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    if isinstance(eps, (int, float)) and not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    gmap = as_geometry_map(geometry)

    def init_fn(params):
        leaves, geoms, treedef = _leaves_with_geometry(params, gmap)
        # replicated on the parameters' mesh, as the update keeps it (a small (slices, d_out) array)
        zero = lambda x, g: jnp.zeros((g.num_slices, g.d_out), jnp.promote_types(x.dtype, jnp.float32))
        nu = [replicated_on_mesh_of(zero(x, g), params) for x, g in zip(leaves, geoms)]
        return ScaleByNeuronSecondMomentState(nu=jax.tree_util.tree_unflatten(treedef, nu))

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        leaves, geoms, treedef = _leaves_with_geometry(updates, gmap)
        nus = treedef.flatten_up_to(state.nu)
        out, new_nu = [], []
        for x, g, nu in zip(leaves, geoms, nus):
            # injected (traced) beta, eps as arguments, as nu: typed on the view's mesh inside auto_axes;
            # Python numbers stay constants (the float64 arithmetic of 1 - beta, bit for bit)
            hyper = () if all(isinstance(v, (int, float)) for v in (beta, eps)) else (beta, eps)
            hyper = tuple(jnp.asarray(v, nu.dtype) for v in hyper)

            def leaf(m, nu, *hp, g=g, dtype=x.dtype):  # m: (slices, d_in, d_out)
                b, e = hp if hp else (beta, eps)
                o = m.astype(nu.dtype)
                nu = b * nu + (1 - b) * jnp.mean(jnp.square(o), axis=1)
                o2 = o / (jnp.sqrt(nu)[:, None, :] + e)
                n1 = jnp.sqrt(jnp.sum(jnp.square(o), axis=(1, 2), keepdims=True))
                n2 = jnp.sqrt(jnp.sum(jnp.square(o2), axis=(1, 2), keepdims=True))
                ratio = jnp.where(n2 > 0, n1 / jnp.where(n2 > 0, n2, 1), 0)
                return (o2 * ratio * orthogonal_update_scale(g, scale)).astype(dtype), nu, *hp

            block, nu, *_ = on_canonical_view(leaf, g, x, nu, *hyper)  # (Explicit meshes: a fused QKV's reshape)
            out.append(block)
            new_nu.append(nu)
        return (
            jax.tree_util.tree_unflatten(treedef, out),
            ScaleByNeuronSecondMomentState(nu=jax.tree_util.tree_unflatten(treedef, new_nu)),
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
