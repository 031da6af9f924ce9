"""Diagnostics of feature learning: is every layer moving by Theta(1)?

The spectral condition asks that hidden features ``h`` and their updates
``dh`` have comparable size at every width, and that every weight and weight
update has spectral norm ``Theta(sqrt(d_out / d_in))``. These functions
measure exactly that:

* :func:`relative_change`: ``||x_new - x_old||_F / ||x_old||_F`` (features:
  the relative feature change ``||dh|| / ||h||``).
* :func:`relative_weight_change`: ``||dW||_* / ||W||_*`` (spectral) or
  ``||dW||_F / ||W||_F`` per parameter, on the canonical matrix view of the
  parameter's :class:`~spectral_optax.Geometry` (max over slices).
* :func:`spectral_norm`, :func:`stable_rank` (``||W||_F^2 / ||W||_*^2``).
* :func:`alignment`: final-layer alignment ``|f| / (||w_out|| ||h||)``.
* :func:`coord_check`: trains a bias-free ReLU MLP for a few steps at several
  widths with a given optimizer and tabulates the relative change of every
  layer's activations (a width-independent table is what muP promises).

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning"
  (relative changes, alignment, Figures 1-3). Yang et al. (2021), "Tensor
  Programs V" (coordinate checks). docs/math.md section 2.
"""

from spectral_optax._transforms.qk_clip import qk_logit_bound
from spectral_optax.diagnostics._coord_check import CoordCheck, coord_check, coord_check_mlp
from spectral_optax.diagnostics._init_alignment import init_alignment, mlp_batch_gradient, outer_product_sum
from spectral_optax.diagnostics._measures import (
    alignment,
    frobenius_norm,
    relative_change,
    relative_feature_change,
    relative_weight_change,
    spectral_norm,
    stable_rank,
)

__all__ = [
    "relative_change",
    "relative_feature_change",
    "spectral_norm",
    "frobenius_norm",
    "stable_rank",
    "relative_weight_change",
    "alignment",
    "CoordCheck",
    "coord_check",
    "coord_check_mlp",
    "init_alignment",
    "mlp_batch_gradient",
    "outer_product_sum",
    "qk_logit_bound",
]
