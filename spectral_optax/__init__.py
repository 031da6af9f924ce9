"""spectral_optax: learning rates that transfer across width and depth.

Geometry (what a parameter is) -> dual maps (how a gradient is normalized in
a norm) -> transforms (optax GradientTransformations) -> named optimizers;
initializers, depth scaling and diagnostics beside them; the lab on top.
"""

# Geometry: the single source of truth for every parameter's layout.
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

# Dual maps and orthogonalization (pure functions).
from spectral_optax.duals.row_column import column_normalize, lp_dual_direction, row_normalize
from spectral_optax.newton_schulz import (
    MUON_QUINTIC,
    newton_schulz,
    optimal_quintic,
    polar_express_coefficients,
)

# Transforms.
from spectral_optax.transforms.spectral import ScaleBySpectralNormState, scale_by_spectral_norm
from spectral_optax.transforms.parametrization import lr_multiplier, scale_by_parametrization1
from spectral_optax.transforms.row_column import scale_by_col_norm, scale_by_row_norm, scale_by_sign
from spectral_optax.transforms.orthogonalize import orthogonalize_via_newton_schulz

# Named optimizers.
from spectral_optax.optimizers.mup import mup_adamw, mup_sgd, spectral_sgd
from spectral_optax.optimizers.muon import muon
from spectral_optax.optimizers.moga import MOGA_RULES, moga, moga_labels, rescaled_adamw

# Depth: inverse-depth residual scaling.
from spectral_optax.depth import (
    decoupled_weight_decay,
    depth_residual_scale,
    depth_scaled_init,
    residual_alpha,
    scale_init,
)

# Initializers, building blocks, diagnostics, the lab.
from spectral_optax import diagnostics, initializers, lab, nn
from spectral_optax.describe import describe
from spectral_optax.diagnostics import (
    alignment,
    coord_check,
    relative_change,
    relative_weight_change,
    spectral_norm,
    stable_rank,
)

__version__ = "0.1.0"

__all__ = [
    "Geometry", "GeometryError", "GeometryMap", "as_geometry_map", "from_matrix", "infer_geometry",
    "label_by_geometry", "map_with_geometry", "to_matrix",
    "column_normalize", "lp_dual_direction", "row_normalize",
    "MUON_QUINTIC", "newton_schulz", "optimal_quintic", "polar_express_coefficients",
    "ScaleBySpectralNormState", "scale_by_spectral_norm", "lr_multiplier", "scale_by_parametrization1",
    "scale_by_col_norm", "scale_by_row_norm", "scale_by_sign", "orthogonalize_via_newton_schulz",
    "mup_adamw", "mup_sgd", "spectral_sgd", "muon", "MOGA_RULES", "moga", "moga_labels", "rescaled_adamw",
    "decoupled_weight_decay", "depth_residual_scale", "depth_scaled_init", "residual_alpha", "scale_init",
    "diagnostics", "initializers", "lab", "nn", "describe",
    "alignment", "coord_check", "relative_change", "relative_weight_change", "spectral_norm", "stable_rank",
]
