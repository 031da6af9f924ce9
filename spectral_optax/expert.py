"""For experts: the plumbing behind the named optimizers.

Nothing here is needed to train with :mod:`spectral_optax`; these are the
pieces the named optimizers and transforms are built from, for users who
compose their own or inspect what a default chose:

* geometry helpers: the canonical matrix view (:func:`~spectral_optax.expert.to_matrix`,
  :func:`~spectral_optax.expert.from_matrix`, see docs/math.md), the geometry tree of a params tree
  (:func:`~spectral_optax.expert.infer_geometry`), geometry-driven ``tree_map`` and
  ``optax.partition`` labels;
* dual maps as pure functions on the canonical view (row / column / l_p
  normalization; the polar factor is :func:`spectral_optax.newton_schulz`);
* Newton-Schulz coefficient tables and the schedule chosen per dtype and
  aspect ratio, with the variant (standard or Gram-space), restarts and
  matmul flops of what runs;
* the distributed orthogonalization plan and its symmetric reduction;
* optimizer states (the ``NamedTuple`` states of the public transforms);
* routes (which rule each parameter kind takes in ``muon``, ``moga`` and
  Parametrization 1) and their learning-rate multipliers;
* depth-scaling plumbing (the default block / branch patterns, a scaled
  initializer wrapper, the companion learning-rate factor);
* the collection name under which attention modules record their max logits
  for :func:`~spectral_optax.qk_clip`.

"""

from __future__ import annotations

from spectral_optax._depth import BLOCK_PATTERN, BRANCH_OUT_PATTERN, depth_lr_multiplier, scale_init
from spectral_optax._distributed.plan import GroupPlan, OrthogonalizationPlan
from spectral_optax._duals.polar import (
    MUON_QUINTIC,
    POWER3_COEFFICIENTS,
    POWER4_COEFFICIENTS,
    YOU_COEFFICIENTS,
    auto_schedule,
    default_preconditioning,
    gram_restarts,
    newton_schulz_flops,
    newton_schulz_method,
    optimal_quintic,
    polar_express_coefficients,
    power4_schedule,
    resolve_coefficients,
)
from spectral_optax._duals.row_column import column_normalize, lp_dual_direction, row_normalize
from spectral_optax._geometry import from_matrix, infer_geometry, label_by_geometry, map_with_geometry, to_matrix
from spectral_optax._mesh.collectives import psum_symmetric
from spectral_optax._optimizers.moga import MOGA_RULES, moga_labels
from spectral_optax._optimizers.muon import MUON_ROUTES
from spectral_optax._transforms.momentum import EmaMomentumState
from spectral_optax._transforms.neuron_norm import ScaleByNeuronSecondMomentState
from spectral_optax._transforms.orthogonalize import orthogonalization_plan
from spectral_optax._transforms.parametrization import ROUTES, lr_multiplier, route_of
from spectral_optax._transforms.qk_clip import MAX_LOGITS
from spectral_optax._transforms.spectral import ScaleBySpectralNormState
from spectral_optax._transforms.weight_decay import DecoupledWeightDecayState

__all__ = [
    # Geometry helpers.
    "to_matrix",
    "from_matrix",
    "infer_geometry",
    "map_with_geometry",
    "label_by_geometry",
    # Dual maps.
    "row_normalize",
    "column_normalize",
    "lp_dual_direction",
    # Newton-Schulz coefficients and schedules.
    "MUON_QUINTIC",
    "YOU_COEFFICIENTS",
    "POWER3_COEFFICIENTS",
    "POWER4_COEFFICIENTS",
    "optimal_quintic",
    "polar_express_coefficients",
    "auto_schedule",
    "power4_schedule",
    "resolve_coefficients",
    "default_preconditioning",
    # What an orthogonalization costs: the variant run per shape, its restarts, its matmul flops.
    "newton_schulz_method",
    "gram_restarts",
    "newton_schulz_flops",
    # Distributed orthogonalization.
    "orthogonalization_plan",
    "OrthogonalizationPlan",
    "GroupPlan",
    "psum_symmetric",
    # Optimizer states.
    "ScaleBySpectralNormState",
    "ScaleByNeuronSecondMomentState",
    "EmaMomentumState",
    "DecoupledWeightDecayState",
    # Routes.
    "ROUTES",
    "route_of",
    "lr_multiplier",
    "MUON_ROUTES",
    "MOGA_RULES",
    "moga_labels",
    # Depth-scaling plumbing.
    "BLOCK_PATTERN",
    "BRANCH_OUT_PATTERN",
    "scale_init",
    "depth_lr_multiplier",
    # QK-clip.
    "MAX_LOGITS",
]
