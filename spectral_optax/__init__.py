"""spectral_optax: learning rates that transfer across width and depth.

Geometry (what a parameter is) -> dual maps (how a gradient is normalized in
a norm) -> transforms (optax GradientTransformations) -> named optimizers;
initializers and diagnostics beside them.
"""

from spectral_optax.geometry import (
    Geometry,
    GeometryError,
    GeometryMap,
    as_geometry_map,
    from_matrix,
    infer_geometry,
    label_by_geometry,
    map_with_geometry,
    to_matrix,
)

__version__ = "0.1.0"
from spectral_optax.transforms.spectral import ScaleBySpectralNormState, scale_by_spectral_norm
from spectral_optax.transforms.parametrization import lr_multiplier, scale_by_parametrization1
from spectral_optax.optimizers.mup import mup_adamw, mup_sgd, spectral_sgd
from spectral_optax.describe import describe
from spectral_optax import initializers
from spectral_optax.duals.row_column import column_normalize, lp_dual_direction, row_normalize
from spectral_optax.transforms.row_column import scale_by_col_norm, scale_by_row_norm, scale_by_sign
from spectral_optax.optimizers.moga import MOGA_RULES, moga, moga_labels, rescaled_adamw

from spectral_optax.depth import (
    decoupled_weight_decay,
    depth_residual_scale,
    depth_scaled_init,
    residual_alpha,
    scale_init,
)
from spectral_optax import nn
from spectral_optax.newton_schulz import (
    MUON_QUINTIC,
    newton_schulz,
    optimal_quintic,
    polar_express_coefficients,
)
from spectral_optax.transforms.orthogonalize import orthogonalize_via_newton_schulz
from spectral_optax.optimizers.muon import muon
from spectral_optax import diagnostics, lab
from spectral_optax.diagnostics import (
    alignment,
    coord_check,
    relative_change,
    relative_weight_change,
    spectral_norm,
    stable_rank,
)
