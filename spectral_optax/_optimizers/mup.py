"""Named optimizers of the spectral condition: ``spectral_sgd``, ``mup_sgd``, ``mup_adamw``.

Each is an ``optax.chain`` of the package's transforms:

    spectral_sgd: momentum -> scale_by_spectral_norm -> weight decay -> -lr
    mup_sgd:      momentum -> scale_by_parametrization1('sgd') -> weight decay -> -lr
    mup_adamw:    Adam -> scale_by_parametrization1('adam') -> weight decay -> -lr

Weight decay is decoupled (``p <- p - lr * wd * p``, multiplied by the
global learning rate only, not by the width multipliers), and by default
spares vectors (biases, norm scales).

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning";
  Yang et al. (2021), "Tensor Programs V"; Loshchilov & Hutter (2019),
  "Decoupled Weight Decay Regularization".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax

from spectral_optax._geometry import GeometryLike, as_geometry_map
from spectral_optax._optimizers.common import optax_aliases, train_float_leaves
from spectral_optax._transforms.parametrization import scale_by_parametrization1
from spectral_optax._transforms.spectral import scale_by_spectral_norm
from spectral_optax._transforms.weight_decay import decay_then_learning_rate

ScalarOrSchedule = float | Callable[[Any], Any]


def _momentum(momentum, nesterov):
    # ``None`` means no momentum buffer; any number (even 0, or a value injected
    # by optax.inject_hyperparams) keeps one.
    return optax.identity() if momentum is None else optax.trace(decay=momentum, nesterov=nesterov)


@optax_aliases(mask="weight_decay_mask")
def spectral_sgd(
    learning_rate: ScalarOrSchedule,
    *,
    momentum: float | None = 0.9,
    nesterov: bool = False,
    method: str = "frobenius",
    power_iterations: int = 2,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """Normalized SGD under the spectral condition.

    ``W <- W - lr * (sqrt(d_out/d_in) * M / ||M||_* + wd * W)`` with ``M`` the
    (heavy-ball or Nesterov) momentum of the gradient; embeddings get each
    token's row at RMS 1, vectors RMS 1 (see :func:`~spectral_optax.scale_by_spectral_norm`).
    The learning rate is width-independent: a value tuned at one width
    transfers.

    Why ``momentum = 0.9`` here and ``None`` in :func:`~spectral_optax.mup_sgd`: a normalized
    step has length ``lr`` whatever the gradient's noise, so without a buffer
    each step follows one minibatch's direction at full length (normalized SGD
    needs momentum to average the noise before the normalization; Cutkosky and
    Mehta 2020, "Momentum Improves Normalized SGD"); :func:`~spectral_optax.mup_sgd` is not
    normalized and keeps ``optax.sgd``'s default.

    Args:
      learning_rate: a float or an optax schedule.
      momentum: heavy-ball coefficient (``None``: no momentum buffer).
      nesterov: Nesterov momentum.
      method: ``'frobenius'`` or ``'power'``, see :func:`~spectral_optax.scale_by_spectral_norm`.
      power_iterations: power-iteration steps per update for ``method='power'``.
      weight_decay: decoupled weight decay coefficient.
      weight_decay_mask: optax mask (tree or callable); default spares vectors.
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.

    References:
      Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning".
    """
    gmap = as_geometry_map(geometry)
    return train_float_leaves(
        optax.chain(
            _momentum(momentum, nesterov),
            scale_by_spectral_norm(method=method, power_iterations=power_iterations, geometry=gmap),
            *decay_then_learning_rate(learning_rate, weight_decay, weight_decay_mask, gmap),
        ),
        gmap,
    )


@optax_aliases(mask="weight_decay_mask")
def mup_sgd(
    learning_rate: ScalarOrSchedule,
    *,
    base: Any = None,
    momentum: float | None = None,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """SGD with Parametrization-1 (muP) per-layer learning rates.

    ``W_l <- W_l - lr * (c_l * M_l + wd * W_l)``, ``c_l = (d_out / n_in)`` divided
    by its value at ``base`` (see :func:`~spectral_optax.scale_by_parametrization1`). With
    ``base`` equal to the model itself this is exactly ``optax.sgd``.

    Args:
      learning_rate: a float or an optax schedule.
      base: params or shapes of the model at the base width (``None``: absolute
        multipliers ``d_out / n_in``).
      momentum: heavy-ball coefficient (``None``: no momentum, like ``optax.sgd``).
      nesterov: Nesterov momentum.
      weight_decay: decoupled weight decay coefficient.
      weight_decay_mask: optax mask (tree or callable); default spares vectors.
      geometry: geometry overrides.

    References:
      Yang, Simon, Bernstein (2023), Parametrization 1; Yang et al. (2021), muP.
    """
    gmap = as_geometry_map(geometry)
    return train_float_leaves(
        optax.chain(
            _momentum(momentum, nesterov),
            scale_by_parametrization1("sgd", base=base, geometry=gmap),
            *decay_then_learning_rate(learning_rate, weight_decay, weight_decay_mask, gmap),
        ),
        gmap,
    )


@optax_aliases(mask="weight_decay_mask")
def mup_adamw(
    learning_rate: ScalarOrSchedule,
    *,
    base: Any = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    weight_decay_mask: Any = None,
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """AdamW with muP per-layer learning rates (``lr / n_in``, relative to ``base``).

    ``W_l <- W_l - lr * (c_l * adam(G)_l + wd * W_l)`` with ``c_l = 1 / n_in``
    divided by its value at ``base``: hidden and read-out layers of width n
    get ``lr * n_base / n``; input layers, embeddings and biases keep ``lr``.
    With ``base`` equal to the model itself this is exactly ``optax.adamw``
    (with the vector-sparing mask).

    Args:
      learning_rate: a float or an optax schedule.
      base: params or shapes of the model at the base width.
      b1, b2, eps: Adam's moment decay rates and epsilon.
      weight_decay: decoupled weight decay coefficient.
      weight_decay_mask: optax mask (tree or callable); default spares vectors.
      geometry: geometry overrides.

    References:
      Yang et al. (2021), "Tensor Programs V", Table 3; Loshchilov & Hutter (2019).
    """
    gmap = as_geometry_map(geometry)
    return train_float_leaves(
        optax.chain(
            optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
            scale_by_parametrization1("adam", base=base, geometry=gmap),
            *decay_then_learning_rate(learning_rate, weight_decay, weight_decay_mask, gmap),
        ),
        gmap,
    )
