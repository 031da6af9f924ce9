"""``normuon``: Muon with neuron-wise normalized orthogonal updates (NorMuon), routed by geometry.

For every Muon-routed matrix (per batch slice of its canonical view,
``j`` the output neuron)::

    m_t = momentum m_{t-1} + (1 - momentum) g_t          (EMA momentum)
    O_t = NS(m_t)                                         (~ U V^T)
    v_t = beta2 v_{t-1} + (1 - beta2) mean_i O_t[i, j]^2
    O'  = O_t / (sqrt(v_t) + eps)
    W  <- W - lr * (scale * ||O_t||_F / ||O'||_F * O' + weight_decay * W)

Every other leaf is routed as by :func:`spectral_optax.muon` (AdamW for
embeddings, vectors and undecided leaves by default). The math:
docs/math.md, "Orthogonalization at fewer flops".

References:
  Z. Li, L. Liu, C. Liang, W. Chen, T. Zhao (2025), "NorMuon: Making Muon more
  efficient and scalable", arXiv:2510.05491.
"""

from __future__ import annotations

from typing import Any

import optax

from spectral_optax._geometry import GeometryLike, as_geometry_map
from spectral_optax._optimizers.muon import muon
from spectral_optax._transforms.neuron_norm import scale_by_neuron_second_moment

__all__ = ["normuon"]


def normuon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: float = 0.95,
    beta2: float = 0.95,
    eps: float = 1e-8,
    nesterov: bool = False,
    scale: Any = "rms",
    geometry: GeometryLike = None,
    **muon_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
    """NorMuon: :func:`spectral_optax.muon` with each output neuron normalized by its second moment.

    The Muon route's orthogonal factor ``O = NS(momentum)`` goes through
    :func:`spectral_optax.scale_by_neuron_second_moment` (``beta2``,
    ``eps``, ``scale``) before weight decay and the learning rate; everything
    else is :func:`spectral_optax.muon`. Defaults are the published ones
    (Li et al. 2025, Algorithm 1): ``momentum = beta2 = 0.95``, ``eps =
    1e-8``, plain EMA momentum (no Nesterov), and update RMS 0.2
    (``scale='rms'``: the result has the Frobenius norm of ``0.2 sqrt(max(d_in,
    d_out)) O``, i.e. ``0.2 sqrt(d_in d_out)`` for an exactly orthogonal
    ``O``), so one learning rate serves the AdamW routes too.

    Args:
      learning_rate: learning rate or schedule.
      momentum: EMA momentum coefficient (NorMuon's ``beta_1``).
      beta2: EMA coefficient of the neuron second moments.
      eps: added to the square root of the second moments.
      nesterov: use the Nesterov form of the momentum (as in
        :func:`spectral_optax.muon`).
      scale: size of the normalized update, as ``scale`` of
        :func:`spectral_optax.muon` (``'rms'`` default, ``'spectral'``,
        ``'muon'``, a number or a function ``geometry -> number``).
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.
      **muon_kwargs: any other keyword argument of :func:`spectral_optax.muon`
        (``weight_decay``, ``ns_coefficients``, routes, AdamW settings, ...),
        except ``scale``, ``after_orthogonalize`` and ``axis_name``.

    Returns:
      An ``optax.GradientTransformationExtraArgs``.

    References:
      Li et al. (2025), NorMuon, arXiv:2510.05491.
    """
    for name in ("scale", "after_orthogonalize", "axis_name"):
        if name in muon_kwargs:
            raise ValueError(f"normuon does not take {name}= (it sets the Muon route's scaling itself)")
    gmap = as_geometry_map(geometry)
    neuron = scale_by_neuron_second_moment(beta2, eps, scale=scale, geometry=gmap)
    return muon(
        learning_rate,
        momentum=momentum,
        nesterov=nesterov,
        geometry=gmap,
        scale=1.0,
        after_orthogonalize=neuron,
        **muon_kwargs,
    )
