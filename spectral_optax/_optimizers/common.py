"""The tail every named optimizer shares: decoupled weight decay, then ``-lr``.

    u <- -lr_t * (u + weight_decay * mask * W)

The decay is multiplied by the global learning rate only (not by any width
or depth multiplier applied before it), and by default spares vectors
(biases, norm scales, also when stacked by ``nn.scan``), as decided by the
geometry rather than by ``ndim``.

References:
  Loshchilov & Hutter (2019), "Decoupled Weight Decay Regularization".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax

from spectral_optax._geometry import GeometryLike, label_by_geometry


def decay_mask_sparing_vectors(geometry: GeometryLike = None) -> Callable[[Any], Any]:
    """Weight-decay mask: ``True`` for matrices and embeddings, ``False`` for vectors."""
    return label_by_geometry(lambda _path, g: g.kind != "vector", geometry)


def decay_then_learning_rate(
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: Any,
    weight_decay_mask: Any = None,
    geometry: GeometryLike = None,
) -> list[optax.GradientTransformation]:
    """``[add_decayed_weights(weight_decay, mask), scale_by_learning_rate(lr)]``.

    ``weight_decay_mask=None`` uses :func:`decay_mask_sparing_vectors`. A
    literal 0 weight decay adds no transform (a value injected by
    ``optax.inject_hyperparams`` is an array and always keeps it, so the
    chain's structure never depends on a traced value).
    """
    parts = []
    if not (isinstance(weight_decay, (int, float)) and weight_decay == 0):
        mask = decay_mask_sparing_vectors(geometry) if weight_decay_mask is None else weight_decay_mask
        parts.append(optax.add_decayed_weights(weight_decay, mask))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return parts
