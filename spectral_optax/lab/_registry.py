"""The lab's registry of named optimizer configurations.

Every benchmark draws its optimizers from here: the optimizer a name stands
for (the function, its options and the parametrization its models start
from), the centre of its learning-rate grid in each experiment, and the
constants tuned at an experiment's proxy. A centre or a constant is written
once, here, and a benchmark that needs one names its experiment.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import optax

import spectral_optax as so

#: The experiments the registry holds LR-grid centres for (peak LR; the benchmarks' grids are factor-2 grids
#: around them), with the benchmark that measures each.
EXPERIMENTS: Mapping[str, str] = types.MappingProxyType(
    {
        "width_mlp": "benchmarks.width_transfer (byte-level MLP); benchmarks.recipe --model mlp",
        "width_dense": "benchmarks.width_transfer on dense inputs, or with no embedding LR multiplier",
        "gpt_width": "benchmarks.gpt_width; benchmarks.qk_clip",
        "recipe_gpt": "benchmarks.recipe --model gpt (the proxy at width 32)",
        "depth_mlp": "benchmarks.depth_transfer",
        "gpt_depth": "benchmarks.gpt_depth",
        "resnet_depth": "benchmarks.resnet_depth",
        "joint_mlp": "benchmarks.joint_transfer",
        "joint_gpt": "benchmarks.joint_transfer --model gpt",
        "tied": "benchmarks.tied_transfer, the tied decoder",
        "untied": "benchmarks.tied_transfer, the untied decoder",
    }
)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A named optimizer configuration of the lab.

    Calling it, ``opt(lr, **options)``, builds the transformation:
    ``make(lr, **defaults, **options)``, chained with
    ``so.route_lr_scale(embedding=embedding_lr_scale)`` when the option
    ``embedding_lr_scale`` is given and not 1 (muP's per-group multiplier on
    the embedding tables; with ``geometry=`` when the options carry one).

    Attributes:
      name: the registry key.
      make: ``(learning_rate, **options) -> optax.GradientTransformation``.
      defaults: keyword options every call passes (overridden by the call's own).
      init: the parametrization its models start from: ``'spectral'``
        (Parametrization 1) or ``'standard'`` (Flax's own initializers).
      centers: experiment -> the centre of the LR grid (peak LR).
      constants: experiment -> the constants tuned at that experiment's proxy.
    """

    name: str
    make: Callable[..., optax.GradientTransformation]
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    init: str = "spectral"
    centers: Mapping[str, float] = dataclasses.field(default_factory=dict)
    constants: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)

    def __call__(self, learning_rate, **options) -> optax.GradientTransformation:
        options = {**self.defaults, **options}
        scale = options.pop("embedding_lr_scale", 1.0)
        tx = self.make(learning_rate, **options)
        if scale == 1.0:
            return tx
        return optax.chain(tx, so.route_lr_scale(embedding=scale, geometry=options.get("geometry")))

    def center(self, experiment: str) -> float:
        """The LR grid's centre in ``experiment`` (a key of :data:`EXPERIMENTS`)."""
        if experiment not in self.centers:
            raise KeyError(
                f"optimizer {self.name!r} has no LR-grid centre for experiment {experiment!r}; "
                f"it has {sorted(self.centers)} (add one in spectral_optax/lab/_registry.py)"
            )
        return self.centers[experiment]

    def grid(self, experiment: str, num: int, ratio: float = 2.0) -> list[float]:
        """``num`` learning rates, factor ``ratio`` apart, around :meth:`center` (``lab.lr_grid``)."""
        from spectral_optax.lab._summary import lr_grid

        return lr_grid(self.center(experiment), num, ratio)


def _moga(p: float) -> Callable[..., optax.GradientTransformation]:
    return lambda lr, **kw: so.moga(lr, p=p, **kw)


# Where the depth studies' centres come from (each moved while a preset's best LR sat on its grid's edge; the
# runs are in docs/lab_log.md): gpt_depth: Muon's best peak LR about 0.07-0.09 at 60 steps, AdamW's scaled best
# at the top edge around 8e-3 and MOGA p = 1.5's unscaled best at the lower edge around 3.2e-2 at 120 steps;
# resnet_depth: Muon's best at 0.02-0.04 for K = 2, 4, MOGA and AdamW at the lower edges of grids around
# 1.6e-2 and 8e-3 (chance-level loss above them). joint_mlp: mup_adamw's best at the top edge around 1.6e-2.
# joint_gpt: gpt_width's best LRs at depth 2, MOGA's centre low enough for 60 steps.
_ENTRIES = (
    Optimizer(
        "muon",
        so.muon,
        centers={
            "width_mlp": 0.03,
            "width_dense": 0.03,
            "gpt_width": 6.4e-2,
            "recipe_gpt": 6.4e-2,
            "depth_mlp": 4e-2,
            # gpt_depth's cpu preset; the orthogonalization methods' training preset (optimizer_speed) found
            # every Muon variant's best LR at this grid's lower edge (docs/lab_log.md) and centres its own at 4e-2.
            "gpt_depth": 8e-2,
            "resnet_depth": 2e-2,
            "joint_mlp": 4e-2,
            "joint_gpt": 5e-2,
            # The tied decoder's muP-family centres are 2x-4x the untied ones: its read-out moves by the table's
            # steps times 1 / d, and the grid must hold the best LR at every width.
            "tied": 0.08,
            "untied": 0.04,
        },
    ),
    Optimizer(
        "moga",
        _moga(2.0),
        centers={
            "width_mlp": 0.01,
            "width_dense": 0.01,
            "gpt_width": 1.6e-2,
            "joint_mlp": 1.6e-2,
            "joint_gpt": 1.6e-2,
            "tied": 0.032,
            "untied": 0.016,
        },
    ),
    # MOGA at three p (the depth studies compare them; MOGA's row rule gives the same entry size for every p at
    # the MLP's width, so one centre serves all there).
    Optimizer("moga1.5", _moga(1.5), centers={"depth_mlp": 4e-3, "gpt_depth": 1.6e-2, "resnet_depth": 1e-3}),
    Optimizer("moga2", _moga(2.0), centers={"depth_mlp": 4e-3, "gpt_depth": 3.2e-2, "resnet_depth": 1e-3}),
    Optimizer("moga2.5", _moga(2.5), centers={"depth_mlp": 4e-3, "gpt_depth": 3.2e-2, "resnet_depth": 1e-3}),
    Optimizer(
        "mup_adamw",
        so.mup_adamw,
        centers={
            # The centre follows the embedding multiplier: best LR 0.0236 at x1, 0.0076 at x16 (width 64).
            "width_mlp": 0.008,
            "width_dense": 0.015,
            "gpt_width": 1.6e-2,
            "recipe_gpt": 1.6e-2,
            "joint_mlp": 3.2e-2,
            "joint_gpt": 1.2e-2,
            "tied": 0.032,
            "untied": 0.016,
        },
        # The embedding LR multiplier tuned at the byte MLP's base width 64 (quick preset) and kept at every
        # width, as muP keeps its per-group multipliers: each embedding row gets a gradient in a fraction of the
        # steps only, so Adam's normalized step moves it slowly at the global LR (docs/lab_log.md, "Why the muP
        # family trails SP AdamW at small width").
        constants={"width_mlp": {"embedding_lr_scale": 16.0}},
    ),
    Optimizer(
        "spectral_sgd",
        so.spectral_sgd,
        defaults={"momentum": 0.9},
        centers={"width_mlp": 0.03, "width_dense": 0.03, "gpt_width": 6.4e-2},
    ),
    # Standard-parametrization AdamW (Flax's own init), the baseline of the width studies.
    Optimizer(
        "adamw_sp",
        optax.adamw,
        defaults={"weight_decay": 1e-4},
        init="standard",
        centers={
            "width_mlp": 6e-3,
            "width_dense": 6e-3,
            "gpt_width": 8e-3,
            # SP AdamW's best LR is higher at width 32 than at 128
            "recipe_gpt": 1.6e-2,
            "tied": 0.008,
            "untied": 0.008,
        },
    ),
    # AdamW on the Parametrization-1 init, no weight decay: the depth studies' Adam.
    Optimizer(
        "adamw",
        optax.adamw,
        defaults={"weight_decay": 0.0},
        centers={"depth_mlp": 4e-3, "gpt_depth": 1.6e-2, "resnet_depth": 1e-3},
    ),
    # The tied decoder's controls: Muon and MOGA on the model's own (Flax) init, and MOGA with Adam on the
    # tables and the norm scales / biases instead of sign steps.
    Optimizer("muon_own", so.muon, init="standard", centers={"tied": 0.04, "untied": 0.04}),
    Optimizer("moga_own", _moga(2.0), init="standard", centers={"tied": 0.016, "untied": 0.016}),
    Optimizer("moga_adam_tables", _moga(2.0), centers={"tied": 0.032, "untied": 0.016}),
)

#: name -> :class:`Optimizer`: every named optimizer configuration of the lab.
OPTIMIZERS: Mapping[str, Optimizer] = types.MappingProxyType({o.name: o for o in _ENTRIES})


def optimizer(name: str) -> Optimizer:
    """The registry's :class:`Optimizer` called ``name``.

    Args:
      name: a key of :data:`OPTIMIZERS`; an unknown name raises ``KeyError`` listing the known ones.
    """
    if name not in OPTIMIZERS:
        raise KeyError(f"unknown optimizer {name!r}; the lab has {list(OPTIMIZERS)}")
    return OPTIMIZERS[name]
