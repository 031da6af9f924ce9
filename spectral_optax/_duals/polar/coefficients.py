"""Coefficient tables of the odd-quintic polar iteration, and the Remez solve behind Polar Express.

One step of the iteration (:func:`~spectral_optax.newton_schulz`) applies the odd quintic
``p(x) = a x + b x^3 + c x^5`` to every singular value of the normalized matrix, so a schedule
is a table of ``(a, b, c)`` rows, one per step, and ``K`` steps map ``sigma`` to
``p_K(...p_1(sigma))`` (docs/math.md section 4). The tables:

* :data:`MUON_QUINTIC` ``(3.4445, -4.7750, 2.0315)`` repeated 5 times
  (Jordan 2024): fast initial growth, but not convergent: singular values end
  roughly in ``[0.7, 1.2]``;
* :func:`polar_express_coefficients`: a minimax-optimal quintic per step
  (Amsel et al. 2025), from :func:`optimal_quintic` (Remez exchange) on pinned
  parameters; converges to 1 for singular values above ``l``;
* :data:`YOU_COEFFICIENTS` (``'you'``, optax's ``'dion'``): You's 5-step set;
* ``'polar_express_schatten'``: the Polar Express construction on
  ``[SCHATTEN_POLAR_EXPRESS_L, 1]``, 4 steps, for the Schatten-4-normalized start;
* :data:`POWER3_COEFFICIENTS` and :data:`POWER4_COEFFICIENTS`: 3 and 4 steps for
  the ``'power'`` start (normalized by a power-iteration estimate of the largest
  singular value, at most :data:`POWER_SAFETY` too large).

Which table runs by default, and how a name is turned into a table, is
:mod:`~spectral_optax._duals.polar.policy`'s.

References:
  Jordan et al. (2024), "Muon: An optimizer for hidden layers in neural
  networks" (modded-nanogpt).
  Amsel, Persson, Musco, Gower (2025), "The Polar Express: Optimal Matrix Sign
  Methods and Their Application to the Muon Algorithm", arXiv:2505.16932.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
import numpy as np

__all__ = [
    "MUON_QUINTIC",
    "POLAR_EXPRESS_CUSHION",
    "POLAR_EXPRESS_L",
    "POLAR_EXPRESS_SAFETY",
    "POWER3_COEFFICIENTS",
    "POWER4_COEFFICIENTS",
    "POWER_SAFETY",
    "SCHATTEN_POLAR_EXPRESS_L",
    "YOU_COEFFICIENTS",
    "Coefficients",
    "Triple",
    "optimal_quintic",
    "polar_express_coefficients",
]

Triple = tuple[float, float, float]

#: The original Muon quintic (Jordan 2024), used for 5 steps.
MUON_QUINTIC: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)

#: You's 5-step schedule (Jiacheng You, 2025; Dion's and optax's ``'dion'``):
#: a different quintic per step, tuned for fast growth of small singular
#: values, ending in ``[0.68, 1.13]`` like the quintic.
YOU_COEFFICIENTS: tuple[Triple, ...] = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)

#: Pinned Polar Express parameters of the published 8-step table
#: (lower end of the singular-value interval, cushion, safety factor).
POLAR_EXPRESS_L: float = 1e-3
POLAR_EXPRESS_CUSHION: float = 0.02407327424182761
POLAR_EXPRESS_SAFETY: float = 1.01

#: Lower end of the interval of :data:`'polar_express_schatten'`: 1e-2 of the
#: largest singular value times the smallest ``sigma_max(X_0)`` the Schatten-4
#: normalization gives a ``768 x 768`` Gaussian matrix (about 0.3).
SCHATTEN_POLAR_EXPRESS_L: float = 3e-3

#: The ``'power'`` start divides by ``min(||X||_{S_8}, POWER_SAFETY * estimate)``:
#: an underestimate of sigma_max by up to this factor still gives
#: ``sigma_max(X_0) <= 1``.
POWER_SAFETY: float = 1.05

#: ``'power3'``: three quintics for the ``'power'`` start. They maximize, in
#: float64, the worst log-distance ``min(log(p(x) / 0.6), log(1.25 / p(x)))``
#: of the composed polynomial from the band ``[0.6, 1.25]`` over ``x`` in
#: ``[1e-2 / POWER_SAFETY, 1.03]`` (singular values down to 1e-2 of the
#: largest after a normalization up to ``POWER_SAFETY`` too large, and up to
#: 3% too small), by Nelder-Mead from the 3-step Polar Express table on that
#: interval with its last row centred in the band. The composition maps that
#: interval into ``[0.638, 1.176]`` (log-margin 0.061; the Polar Express start
#: had 0.045); above ``x = 1.04`` it leaves the band (docs/math.md,
#: "Orthogonalization at fewer flops").
POWER3_COEFFICIENTS: tuple[Triple, ...] = (
    (8.033912339860501, -21.77917737021943, 14.932846370798163),
    (3.560245066179914, -2.5279315483912725, 0.47068370925965963),
    (2.4876687825809993, -1.8771767599966456, 0.4297615808977452),
)

#: ``'power4'``: four quintics for the ``'power'`` start, the Polar Express
#: construction (:func:`~spectral_optax.expert.polar_express_coefficients`, cushion 0.1, no safety
#: factor) on ``[1e-2 / (POWER_SAFETY * 1.03), 1]`` with every polynomial's
#: argument divided by 1.03, so that it covers ``[1e-2 / POWER_SAFETY, 1.03]``
#: like :data:`~spectral_optax.expert.POWER3_COEFFICIENTS`: float64 range ``[0.938, 1.027]`` there.
#: The bfloat16 default (``power4_schedule``).
POWER4_COEFFICIENTS: tuple[Triple, ...] = (
    (7.228817058908975, -16.881974838788487, 11.156013182177627),
    (3.4095806650043747, -2.1350918062772806, 0.37832225857796686),
    (2.7552838284777317, -1.9397317443162336, 0.40412588137076894),
    (1.9548526773186243, -1.2780350181549587, 0.336356883098494),
)

Coefficients = str | Triple | Sequence[Triple] | np.ndarray | Callable[[jax.Array], jax.Array]


# --------------------------------------------------------------------------
# Polar Express: minimax-optimal odd quintics by equioscillation.
# --------------------------------------------------------------------------
def optimal_quintic(l: float, u: float) -> Triple:
    """The odd quintic ``p(x) = a x + b x^3 + c x^5`` minimizing ``max |1 - p|`` on ``[l, u]``.

    Remez exchange: the optimum equioscillates at four points
    ``l < q < r < u`` (``q, r`` the critical points of ``p``) with
    ``1 - p = E, -E, E, -E``. Solve the 4x4 linear system for ``(a, b, c, E)``,
    move ``q, r`` to the roots of ``p'(x) = a + 3 b x^2 + 5 c x^4``, repeat
    until ``E`` is stationary (float64).

    Args:
      l: lower end of the interval, ``0 < l <= u``.
      u: upper end.

    Returns:
      ``(a, b, c)`` as Python floats.
    """
    if not 0 < l <= u:
        raise ValueError(f"optimal_quintic needs 0 < l <= u, got l={l}, u={u}")
    if l / u >= 1 - 5e-6:
        # The interval is a point up to float64 accuracy of the solve: the
        # equioscillating polynomial is the convergent Newton-Schulz quintic.
        return (15 / 8) / u, (-10 / 8) / u**3, (3 / 8) / u**5
    q, r = (3 * l + 1) / 4, (l + 3) / 4  # exact as l -> u
    err, old_err = math.inf, None
    for _ in range(100):
        if old_err is not None and abs(old_err - err) <= 1e-15:
            break
        old_err = err
        pts = np.array([l, q, r, u], dtype=np.float64)
        lhs = np.stack([pts, pts**3, pts**5, np.array([1.0, -1.0, 1.0, -1.0])], axis=1)
        a, b, c, err = np.linalg.solve(lhs, np.ones(4))
        disc = math.sqrt(9 * b * b - 20 * a * c)
        q, r = np.sqrt((-3 * b + np.array([-disc, disc])) / (10 * c))
    return float(a), float(b), float(c)


@functools.lru_cache(maxsize=64)
def polar_express_coefficients(
    num_steps: int = 8,
    *,
    l: float = POLAR_EXPRESS_L,
    cushion: float = POLAR_EXPRESS_CUSHION,
    safety: float = POLAR_EXPRESS_SAFETY,
) -> tuple[Triple, ...]:
    """Polar Express schedule: one minimax-optimal quintic per step.

    Starting from the interval ``[l, u] = [l, 1]`` that holds every singular
    value of the normalized matrix, step ``k`` takes the optimal quintic on
    ``[max(l, cushion * u), u]`` (:func:`~spectral_optax.expert.optimal_quintic`; the cushion keeps
    early steps from over-fitting tiny singular values), rescales it so that
    ``p(l)`` and ``p(u)`` are centred on 1 (``p <- 2 p / (p(l) + p(u))``), and
    maps the interval to ``[p(l), 2 - p(l)]``. The interval shrinks to 1, and
    the last polynomials tend to the convergent ``(15/8, -10/8, 3/8)``.
    Finally every polynomial but the last is divided by the safety factor
    ``s`` in its argument, ``(a, b, c) -> (a / s, b / s^3, c / s^5)``, a
    guard against round-off pushing singular values above the interval.

    With the pinned defaults and ``safety=1`` the 8-step table is the
    published one (first row ``(8.28721201814563, -23.595886519098837,
    17.300387312530933)``).

    Args:
      num_steps: number of polynomials.
      l: lower end of the initial singular-value interval (values below it
        still grow, but without the minimax guarantee).
      cushion: relative floor of the interval each step optimizes for.
      safety: safety factor ``s >= 1`` (1 disables it).

    Returns:
      A tuple of ``num_steps`` ``(a, b, c)`` triples of Python floats.

    References:
      Amsel, Persson, Musco, Gower (2025), "The Polar Express", Algorithm 1.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if not 0 < l < 1:
        raise ValueError(f"l must be in (0, 1), got {l}")
    if not 0 <= cushion < 1:
        raise ValueError(f"cushion must be in [0, 1), got {cushion}")
    if safety < 1:
        raise ValueError(f"safety must be >= 1, got {safety}")
    lo, hi = float(l), 1.0
    table = []
    for _ in range(num_steps):
        a, b, c = optimal_quintic(max(lo, cushion * hi), hi)
        p_lo = a * lo + b * lo**3 + c * lo**5
        p_hi = a * hi + b * hi**3 + c * hi**5
        rescale = 2.0 / (p_lo + p_hi)
        a, b, c = a * rescale, b * rescale, c * rescale
        table.append((a, b, c))
        lo = a * lo + b * lo**3 + c * lo**5
        hi = 2.0 - lo
    s = float(safety)
    table = [(a / s, b / s**3, c / s**5) for a, b, c in table[:-1]] + [table[-1]]
    return tuple(table)
