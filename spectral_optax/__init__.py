"""spectral_optax: learning rates that transfer across width and depth.

Geometry (what a parameter is) -> dual maps (how a gradient is normalized in
a norm) -> transforms (optax ``GradientTransformation``s) -> named
optimizers; initializers, depth scaling and diagnostics beside them; the lab
and the Flax blocks on top. The math is in ``docs/math.md``.

Implementation modules are private (leading underscore); this module and the
documented subpackages ``initializers``, ``diagnostics``, ``nn``, ``lab`` and
``transfer`` are the public API. ``diagnostics``, ``nn`` and ``lab`` (and the diagnostic
functions re-exported here) are imported on first use, so ``import
spectral_optax`` loads neither Flax's module system nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

from spectral_optax import initializers

# Depth: inverse-depth residual scaling.
from spectral_optax._depth import (
    BLOCK_PATTERN,
    BRANCH_OUT_PATTERN,
    depth_lr_multiplier,
    depth_lr_scale,
    depth_residual_scale,
    depth_scaled_init,
    residual_alpha,
    scale_init,
)
from spectral_optax._describe import describe
from spectral_optax._duals.polar import (
    MUON_QUINTIC,
    POWER3_COEFFICIENTS,
    POWER4_COEFFICIENTS,
    YOU_COEFFICIENTS,
    auto_schedule,
    newton_schulz,
    optimal_quintic,
    polar_express_coefficients,
    power4_schedule,
    psum_symmetric,
)

# Dual maps and orthogonalization (pure functions on the canonical view).
from spectral_optax._duals.row_column import (
    column_normalize,
    lp_dual_direction,
    row_normalize,
)

# Geometry: the single source of truth for every parameter's layout.
from spectral_optax._geometry import (
    Geometry,
    GeometryError,
    GeometryMap,
    GeometryWarning,
    as_geometry_map,
    from_matrix,
    infer_geometry,
    init_with_geometry,
    label_by_geometry,
    map_with_geometry,
    to_matrix,
)
from spectral_optax._optimizers.moga import (
    MOGA_RULES,
    moga,
    moga_labels,
    rescaled_adamw,
)
from spectral_optax._optimizers.muon import MUON_ROUTES, contrib_muon, muon

# Named optimizers.
from spectral_optax._optimizers.mup import mup_adamw, mup_sgd, spectral_sgd
from spectral_optax._optimizers.normuon import normuon
from spectral_optax._plan import GroupPlan, OrthogonalizationPlan
from spectral_optax._transforms.momentum import EmaMomentumState, ema_momentum
from spectral_optax._transforms.neuron_norm import ScaleByNeuronSecondMomentState, scale_by_neuron_second_moment
from spectral_optax._transforms.orthogonalize import orthogonalization_plan, orthogonalize_via_newton_schulz
from spectral_optax._transforms.parametrization import (
    ROUTES,
    lr_multiplier,
    route_lr_scale,
    route_of,
    scale_by_parametrization1,
)
from spectral_optax._transforms.qk_clip import (
    AttentionSpec,
    attention_max_logits,
    collect_max_logits,
    qk_clip,
    qk_logit_bound,
)
from spectral_optax._transforms.row_column import (
    scale_by_col_norm,
    scale_by_row_norm,
    scale_by_sign,
)

# Transforms.
from spectral_optax._transforms.spectral import (
    ScaleBySpectralNormState,
    scale_by_fan_out_rms,
    scale_by_spectral_norm,
)
from spectral_optax._transforms.trust_ratio import scale_by_spectral_trust_ratio
from spectral_optax._transforms.weight_decay import (
    DecoupledWeightDecayState,
    decoupled_weight_decay,
)

__version__ = "0.1.0"

# Loaded on first use (PEP 562): name -> (module, attribute or None for the module).
_LAZY = {
    "diagnostics": ("spectral_optax.diagnostics", None),
    "lab": ("spectral_optax.lab", None),
    "nn": ("spectral_optax.nn", None),
    "transfer": ("spectral_optax.transfer", None),
    "alignment": ("spectral_optax.diagnostics", "alignment"),
    "coord_check": ("spectral_optax.diagnostics", "coord_check"),
    "relative_change": ("spectral_optax.diagnostics", "relative_change"),
    "relative_weight_change": ("spectral_optax.diagnostics", "relative_weight_change"),
    "spectral_norm": ("spectral_optax.diagnostics", "spectral_norm"),
    "stable_rank": ("spectral_optax.diagnostics", "stable_rank"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = importlib.import_module(module)
        if attr is not None:
            value = getattr(value, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'spectral_optax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Geometry",
    "GeometryError",
    "GeometryMap",
    "GeometryWarning",
    "as_geometry_map",
    "from_matrix",
    "infer_geometry",
    "init_with_geometry",
    "label_by_geometry",
    "map_with_geometry",
    "to_matrix",
    "column_normalize",
    "lp_dual_direction",
    "row_normalize",
    "MUON_QUINTIC",
    "POWER3_COEFFICIENTS",
    "POWER4_COEFFICIENTS",
    "auto_schedule",
    "power4_schedule",
    "psum_symmetric",
    "YOU_COEFFICIENTS",
    "newton_schulz",
    "optimal_quintic",
    "polar_express_coefficients",
    "ScaleBySpectralNormState",
    "scale_by_spectral_norm",
    "lr_multiplier",
    "scale_by_parametrization1",
    "ROUTES",
    "route_lr_scale",
    "route_of",
    "scale_by_col_norm",
    "scale_by_row_norm",
    "scale_by_sign",
    "orthogonalize_via_newton_schulz",
    "ScaleByNeuronSecondMomentState",
    "scale_by_neuron_second_moment",
    "orthogonalization_plan",
    "OrthogonalizationPlan",
    "GroupPlan",
    "scale_by_spectral_trust_ratio",
    "qk_clip",
    "qk_logit_bound",
    "attention_max_logits",
    "collect_max_logits",
    "AttentionSpec",
    "EmaMomentumState",
    "ema_momentum",
    "scale_by_fan_out_rms",
    "DecoupledWeightDecayState",
    "decoupled_weight_decay",
    "mup_adamw",
    "mup_sgd",
    "spectral_sgd",
    "MUON_ROUTES",
    "muon",
    "contrib_muon",
    "normuon",
    "MOGA_RULES",
    "moga",
    "moga_labels",
    "rescaled_adamw",
    "BLOCK_PATTERN",
    "BRANCH_OUT_PATTERN",
    "depth_lr_multiplier",
    "depth_lr_scale",
    "depth_residual_scale",
    "depth_scaled_init",
    "residual_alpha",
    "scale_init",
    "initializers",
    "describe",
    "diagnostics",
    "lab",
    "nn",
    "alignment",
    "coord_check",
    "relative_change",
    "relative_weight_change",
    "spectral_norm",
    "stable_rank",
]
