"""spectral_optax: learning rates that transfer across width and depth.

Geometry (what a parameter is) -> dual maps (how a gradient is normalized in
a norm) -> transforms (optax ``GradientTransformation``s) -> named
optimizers; initializers, depth scaling and diagnostics beside them; the lab
and the Flax blocks on top. The math is in ``docs/math.md``.

Implementation modules are private (leading underscore). The public API is
this module's ``__all__`` (the named optimizers, the composable transforms,
the geometry a user touches, depth scaling) and the documented subpackages
``initializers``, ``diagnostics``, ``nn``, ``lab``, ``transfer`` and
``expert`` (the plumbing behind the named optimizers: coefficient tables,
schedules, plans, dual maps as pure functions, optimizer states, routes).
``diagnostics``, ``nn``, ``lab``, ``transfer`` and ``expert`` are imported on
first use, so ``import spectral_optax`` loads neither Flax's module system nor
matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

from spectral_optax import initializers

# Depth: inverse-depth residual scaling.
from spectral_optax._depth import (
    depth_lr_scale,
    depth_residual_scale,
    depth_scaled_init,
    residual_alpha,
)
from spectral_optax._describe import describe
from spectral_optax._duals.polar import newton_schulz

# Geometry: the single source of truth for every parameter's layout.
from spectral_optax._geometry import (
    Geometry,
    GeometryError,
    GeometryMap,
    GeometryWarning,
    as_geometry_map,
    init_with_geometry,
)

# Named optimizers.
from spectral_optax._optimizers.contrib import contrib_muon
from spectral_optax._optimizers.moga import moga, rescaled_adamw
from spectral_optax._optimizers.muon import muon
from spectral_optax._optimizers.mup import mup_adamw, mup_sgd, spectral_sgd
from spectral_optax._optimizers.normuon import normuon

# Composable transforms.
from spectral_optax._transforms.momentum import ema_momentum
from spectral_optax._transforms.neuron_norm import scale_by_neuron_second_moment
from spectral_optax._transforms.orthogonalize import orthogonalize_via_newton_schulz
from spectral_optax._transforms.parametrization import route_lr_scale, scale_by_parametrization1
from spectral_optax._transforms.qk_clip import AttentionSpec, attention_max_logits, collect_max_logits, qk_clip
from spectral_optax._transforms.row_column import scale_by_column_norm, scale_by_row_norm, scale_by_sign
from spectral_optax._transforms.spectral import scale_by_fan_out_rms, scale_by_spectral_norm
from spectral_optax._transforms.trust_ratio import scale_by_spectral_trust_ratio
from spectral_optax._transforms.weight_decay import decoupled_weight_decay

__version__ = "0.1.0"

#: Submodules loaded on first use (PEP 562).
_LAZY = ("diagnostics", "expert", "lab", "nn", "transfer")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = importlib.import_module(f"spectral_optax.{name}")
        globals()[name] = value
        return value
    raise AttributeError(f"module 'spectral_optax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    # Named optimizers.
    "muon",
    "contrib_muon",
    "normuon",
    "moga",
    "rescaled_adamw",
    "spectral_sgd",
    "mup_sgd",
    "mup_adamw",
    # Composable transforms.
    "scale_by_spectral_norm",
    "scale_by_row_norm",
    "scale_by_column_norm",
    "scale_by_sign",
    "scale_by_fan_out_rms",
    "orthogonalize_via_newton_schulz",
    "scale_by_parametrization1",
    "route_lr_scale",
    "scale_by_neuron_second_moment",
    "scale_by_spectral_trust_ratio",
    "ema_momentum",
    "decoupled_weight_decay",
    "qk_clip",
    "newton_schulz",
    # QK-clip's inputs.
    "AttentionSpec",
    "attention_max_logits",
    "collect_max_logits",
    # Depth scaling.
    "depth_residual_scale",
    "depth_lr_scale",
    "depth_scaled_init",
    "residual_alpha",
    # Geometry.
    "Geometry",
    "GeometryMap",
    "GeometryError",
    "GeometryWarning",
    "as_geometry_map",
    "describe",
    "init_with_geometry",
    # Submodules.
    "initializers",
    "diagnostics",
    "expert",
    "lab",
    "nn",
    "transfer",
]
