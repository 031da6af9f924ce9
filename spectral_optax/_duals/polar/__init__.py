"""Orthogonalization by odd matrix polynomials (Newton-Schulz / polar iterations).

For a matrix ``G = U S V^T`` (thin SVD) the orthogonal polar factor ``U V^T`` is the
steepest-descent direction under the spectral norm (docs/math.md sections 3-4). It is
approximated without an SVD by iterating odd quintics ``p(x) = a x + b x^3 + c x^5`` on a
normalized start, which act on the singular values only::

    X_0 = G / (||G||_F * safety),   X_{k+1} = a_k X_k + (b_k A_k + c_k A_k^2) X_k,   A_k = X_k X_k^T.

The package, one idea per module:

* :mod:`~spectral_optax._duals.polar.coefficients`: the coefficient tables and the Remez
  solve of the Polar Express schedules;
* :mod:`~spectral_optax._duals.polar.policy`: what runs by default: compute dtype, matmul
  precision, schedule per dtype and shape, Gram-space restarts, and the flops model;
* :mod:`~spectral_optax._duals.polar.iteration`: the iteration itself
  (:func:`~spectral_optax.newton_schulz`).

The Gram all-reduce of a matrix split over devices is
:func:`spectral_optax._mesh.collectives.psum_symmetric`.
"""

from __future__ import annotations

from spectral_optax._duals.polar.coefficients import (
    MUON_QUINTIC,
    POLAR_EXPRESS_CUSHION,
    POLAR_EXPRESS_L,
    POLAR_EXPRESS_SAFETY,
    POWER3_COEFFICIENTS,
    POWER4_COEFFICIENTS,
    POWER_SAFETY,
    SCHATTEN_POLAR_EXPRESS_L,
    YOU_COEFFICIENTS,
    Coefficients,
    Triple,
    optimal_quintic,
    polar_express_coefficients,
)
from spectral_optax._duals.polar.iteration import POWER_GUARD, newton_schulz
from spectral_optax._duals.polar.policy import (
    AUTO_GRAM_ASPECT,
    HALF_PRECISION_RESTART_EVERY,
    POWER_ITERATIONS,
    POWER_STARTS,
    PRECONDITIONINGS,
    auto_coefficients,
    auto_schedule,
    default_compute_dtype,
    default_preconditioning,
    gram_restarts,
    newton_schulz_flops,
    newton_schulz_method,
    power4_schedule,
    resolve_coefficients,
    resolve_precision,
    user_function_dtype,
)

__all__ = [
    "AUTO_GRAM_ASPECT",
    "HALF_PRECISION_RESTART_EVERY",
    "MUON_QUINTIC",
    "POLAR_EXPRESS_CUSHION",
    "POLAR_EXPRESS_L",
    "POLAR_EXPRESS_SAFETY",
    "POWER3_COEFFICIENTS",
    "POWER4_COEFFICIENTS",
    "POWER_GUARD",
    "POWER_ITERATIONS",
    "POWER_SAFETY",
    "POWER_STARTS",
    "PRECONDITIONINGS",
    "SCHATTEN_POLAR_EXPRESS_L",
    "YOU_COEFFICIENTS",
    "Coefficients",
    "Triple",
    "auto_coefficients",
    "auto_schedule",
    "default_compute_dtype",
    "default_preconditioning",
    "gram_restarts",
    "newton_schulz",
    "newton_schulz_flops",
    "newton_schulz_method",
    "optimal_quintic",
    "polar_express_coefficients",
    "power4_schedule",
    "resolve_coefficients",
    "resolve_precision",
    "user_function_dtype",
]
