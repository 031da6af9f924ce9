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

from spectral_optax._duals.polar import Coefficients
from spectral_optax._geometry import GeometryLike, as_geometry_map
from spectral_optax._optimizers.common import optax_aliases
from spectral_optax._optimizers.muon import muon
from spectral_optax._transforms.neuron_norm import scale_by_neuron_second_moment

__all__ = ["normuon"]


@optax_aliases(
    beta="momentum", ns_coeffs="ns_coefficients", preconditioning="ns_preconditioning", mask="weight_decay_mask"
)
def normuon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: float = 0.95,
    beta2: float = 0.95,
    eps: float = 1e-8,
    nesterov: bool = False,
    scale: Any = "rms",
    geometry: GeometryLike = None,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    ns_coefficients: Coefficients = "auto",
    ns_steps: int | None = None,
    ns_method: str = "auto",
    ns_preconditioning: str | None = None,
    compute_dtype: Any = None,
    embedding: str | optax.GradientTransformation = "adamw",
    vector: str | optax.GradientTransformation = "adamw",
    output: str | optax.GradientTransformation = "muon",
    elementwise: str | optax.GradientTransformation = "adamw",
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps: float = 1e-8,
    adam_weight_decay: float = 0.0,
    mu_dtype: Any = None,
    distribute: bool | None = None,
    flops_per_byte: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    """NorMuon: :func:`spectral_optax.muon` with each output neuron normalized by its second moment.

    The Muon route's orthogonal factor ``O = NS(momentum)`` goes through
    :func:`spectral_optax.scale_by_neuron_second_moment` (``beta2``,
    ``eps``, ``scale``) before weight decay and the learning rate; everything
    else is :func:`spectral_optax.muon` (the arguments below are passed to
    it; ``bias_correction`` and ``adam_nesterov`` keep muon's defaults). Defaults are the published ones
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
      weight_decay: decoupled weight decay (times the learning rate), as in
        :func:`spectral_optax.muon`.
      weight_decay_mask: which leaves decay, as in :func:`spectral_optax.muon`.
      ns_coefficients: Newton-Schulz coefficients (``'auto'``: by compute dtype).
      ns_steps: Newton-Schulz steps (default from the coefficients).
      ns_method: ``'auto'``, ``'standard'`` or ``'gram'``.
      ns_preconditioning: ``None``, ``'frobenius'``, ``'schatten'``, ``'aol'`` or ``'power'``.
      compute_dtype: Newton-Schulz dtype (``None``: float32 on CPU, bfloat16
        on GPU/TPU).
      embedding: route of embedding tables (``'adamw'``, ``'normalize'``,
        ``'muon'`` or a transformation).
      vector: route of biases and norm scales.
      output: route of the output head's matrix.
      elementwise: route of leaves no geometry rule decides.
      adam_learning_rate: AdamW routes' learning rate (default: ``learning_rate``).
      adam_b1: AdamW's first-moment coefficient.
      adam_b2: AdamW's second-moment coefficient.
      adam_eps: AdamW's epsilon.
      adam_weight_decay: AdamW routes' decoupled weight decay.
      mu_dtype: dtype of the momentum buffers.
      distribute: spread whole matrices over the mesh's devices for the
        orthogonalization (see :func:`spectral_optax.muon`).
      flops_per_byte: the distributed plan's flops per collective byte (default: the device's row of
        the table in :func:`~spectral_optax.orthogonalize_via_newton_schulz`).

    Returns:
      An ``optax.GradientTransformationExtraArgs``.

    References:
      Li et al. (2025), NorMuon, arXiv:2510.05491.
    """
    gmap = as_geometry_map(geometry)
    neuron = scale_by_neuron_second_moment(beta2, eps, scale=scale, geometry=gmap)
    return muon(
        learning_rate,
        momentum=momentum,
        nesterov=nesterov,
        geometry=gmap,
        scale=1.0,
        after_orthogonalize=neuron,
        weight_decay=weight_decay,
        weight_decay_mask=weight_decay_mask,
        ns_coefficients=ns_coefficients,
        ns_steps=ns_steps,
        ns_method=ns_method,
        ns_preconditioning=ns_preconditioning,
        compute_dtype=compute_dtype,
        embedding=embedding,
        vector=vector,
        output=output,
        elementwise=elementwise,
        adam_learning_rate=adam_learning_rate,
        adam_b1=adam_b1,
        adam_b2=adam_b2,
        adam_eps=adam_eps,
        adam_weight_decay=adam_weight_decay,
        mu_dtype=mu_dtype,
        distribute=distribute,
        flops_per_byte=flops_per_byte,
    )
