"""The whole recipe on a language model the package did not write, judged against AdamW on the model's own init.

The model is a decoder written as google-deepmind/nanodo writes one (:class:`TransformerDo`, :class:`DoConfig`:
``DenseGeneral`` heads, learned positions, pre-LayerNorm blocks, logits by the tied ``embed.attend``, FSDP
``nn.Partitioned`` boxes on every parameter; ``tied=False`` reads out by a ``Dense`` head); the data is
byte-level next-byte prediction on Python's bundled ``pydoc_data`` (``lab.load('text', sequence=True)``). A
user follows the README and the guide to the letter, through the public API only:

1. **Tune at the proxy** (:data:`PRESETS`: width 32, 150 steps, batch 16): a factor-2 LR grid around the
   registry's centre (:func:`spectral_optax.lab.optimizer`, experiments ``'tied'`` / ``'untied'``), moved by
   two points while the best LR sits on its edge. The proxy's LR is its best grid LR (seed-mean train loss).
2. **Transfer** it with :func:`spectral_optax.transfer.transfer` (the horizon and batch rules; width is the
   parametrization's) to each target (width 128 and 256, 4x the steps, 2x the batch).
3. **Sweep the target** on a ``sqrt(2)`` grid centred on the transferred LR (extended by two points while its
   best is on an edge), plus the naive LR (the proxy's, unchanged).

Per setup (:data:`SETUPS`) and target: the **regret** of the transferred LR
(:func:`spectral_optax.lab.regret`, nats and ``sqrt(2)``-grid steps; reference: the best over every LR the
target ran), the naive LR's regret, the target's **own best** loss, and the loss at the transferred LR minus
the best loss of ``optax.adamw`` on the model's own init **tuned at the target** (``vs_adamw``; negative: the
recipe beats leaving the model alone). Train loss: the mean of the last 5% of steps, seed-averaged; every run
warm-up + cosine (:func:`spectral_optax.lab.warmup_cosine`).

    from spectral_optax.lab import third_party
    report = third_party.run(third_party.PRESETS['quick'], out='out')   # benchmarks/third_party_lm.py
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

import spectral_optax as so
from spectral_optax import transfer as st
from spectral_optax.lab._data import load
from spectral_optax.lab._models import Model, loss_for
from spectral_optax.lab._nanodo import CausalAttn, DoConfig, Mlp, TBlock, TransformerDo
from spectral_optax.lab._nanodo_nnx import TransformerDoNNX
from spectral_optax.lab._registry import optimizer as registry
from spectral_optax.lab._regret import regret
from spectral_optax.lab._summary import summarize
from spectral_optax.lab._sweep import sweep

__all__ = [
    "BASELINE",
    "CausalAttn",
    "DoConfig",
    "Mlp",
    "PRESETS",
    "SETUPS",
    "Setup",
    "TBlock",
    "TransformerDo",
    "MOGA_VARIANTS",
    "MUP_VARIANTS",
    "STUDIES",
    "diagnose",
    "make_model",
    "optimizer_factory",
    "run",
]


@dataclasses.dataclass(frozen=True)
class Setup:
    """One way a user trains the model.

    Attributes:
      optimizer: the lab registry's name (:data:`spectral_optax.lab.OPTIMIZERS`): the function, its options and
        its LR-grid centres for ``'tied'`` / ``'untied'``.
      init: ``'own'`` (the model as written) or ``'spectral'`` (``so.initializers.reinitialize`` from the
        traced geometry, and on the tied model the read-out multiplier ``c / d`` by
        ``so.initializers.tied_readout``: the guide's tied path).
      c: the tied read-out's constant (``tied_readout_multiplier``'s ``base_width``).
      r: the tables' LR multiplier (``so.route_lr_scale(embedding=r)`` after the optimizer).
      s: the tables' init standard deviation (``reinitialize``'s ``embedding_std``).
      options: keyword options of the optimizer (e.g. MOGA's ``base_factor``, ``rules``).
      center_scale: multiplies the registry's LR-grid centre (the grid must hold the proxy's best LR).
    """

    optimizer: str
    init: str = "spectral"
    c: float = 1.0
    r: float = 1.0
    s: float = 1.0
    options: Mapping = dataclasses.field(default_factory=dict)
    center_scale: float = 1.0


#: The baseline: ``optax.adamw`` (weight decay 1e-4) on the model's own init, its LR moved by ``so.transfer``
#: too and also tuned at the target.
BASELINE = "adamw"
#: The setups: the guide's tied path with its starting constants (docs/guide.md, "A tied read-out": ``muon``
#: c / r / s = 4 / 4 / 0.25, ``mup_adamw`` 4 / 16 / 1, ``moga`` 4 / 4 / 0.5 with ``base_factor=1`` and Adam on
#: the tables, norm scales and biases); ``muon_own``: Muon on the model's own init, nothing else;
#: ``mup_adamw_own``: ``mup_adamw``'s per-layer LRs on the model's own init, nothing else; ``adamw``: the
#: baseline. On the untied model ``c`` has no read-out to act on (the head is a matrix).
SETUPS: Mapping[str, Setup] = {
    "muon": Setup("muon", c=4.0, r=4.0, s=0.25),
    "muon_own": Setup("muon_own", init="own"),
    "mup_adamw": Setup("mup_adamw", c=4.0, r=16.0, s=1.0),
    "moga": Setup(
        "moga",
        c=4.0,
        r=4.0,
        s=0.5,
        options={"base_factor": 1.0, "rules": {r"(embedding|scale|bias)$": "adam"}},
        center_scale=4.0,  # the registry's centre is for base_factor 25; 1 wants about sqrt(25) = 5x
    ),
    # issue 50's diagnosis at width 128 (docs/benchmarks.md): muP's per-layer LRs on the model's own init
    "mup_adamw_own": Setup("mup_adamw", init="own"),
    BASELINE: Setup("adamw_sp", init="own"),
}

#: Sizes of the recipe: ``proxy``, ``targets`` as ``(width, steps, batch)``; ``context``, ``blocks`` (head
#: dim 16, so ``H = D / 16``; ``F = 4 D``); ``proxy_lrs`` factor-2 grid points at the proxy;
#: ``target_half``: the target's ``sqrt(2)`` grid is the transferred LR times ``sqrt(2)^k``, ``|k| <=
#: target_half``; ``moves``: edge moves allowed per grid; ``eval_examples``: validation sequences per run.
PRESETS: Mapping[str, Mapping] = {
    "quick": {
        "proxy": (16, 12, 4),
        "targets": ((32, 48, 8),),
        "context": 16,
        "blocks": 1,
        "proxy_lrs": 5,
        "target_half": 2,
        "seeds": 2,
        "moves": 0,
        "eval_examples": 64,
        "models": ("tied",),
        "setups": ("muon", BASELINE),
    },
    "full": {
        "proxy": (32, 150, 16),
        "targets": ((128, 600, 32), (256, 600, 32)),
        "context": 64,
        "blocks": 2,
        "proxy_lrs": 8,
        "target_half": 3,
        "seeds": 2,
        "moves": 2,
        "eval_examples": 256,
        "models": ("tied", "untied"),
        "setups": tuple(SETUPS),
    },
}


def config(width: int, data, *, tied: bool, blocks: int) -> DoConfig:
    """nanodo's ``DoConfig`` at ``width``: heads of 16, ``F = 4 D``, the data's context and vocabulary."""
    return DoConfig(D=width, H=max(1, width // 16), L=data.context, N=blocks, V=256, F=4 * width, tied=tied)


def make_model(
    width: int, data, *, tied: bool, blocks: int, setup: Setup, framework: str = "linen"
) -> tuple[Model, so.GeometryMap]:
    """``(lab.Model, geometry)`` of :class:`TransformerDo` (``framework='linen'``) or :class:`TransformerDoNNX`
    (``'nnx'``; params: its ``nnx.State`` of ``nnx.Param``) at ``width`` as ``setup`` trains it.

    ``init='own'``: the module's init and apply, untouched. ``'spectral'``: params redrawn by
    ``so.initializers.reinitialize(..., embedding_std=s)`` from the traced geometry
    (``so.GeometryMap.from_linen`` / ``from_nnx``) and, when tied, the read-out multiplier ``c / d``
    (``so.initializers.tied_readout`` around every apply; NNX: ``tied_readout_nnx`` on the module).
    """
    if framework not in ("linen", "nnx"):
        raise ValueError(f"make_model: framework must be 'linen' or 'nnx', got {framework!r}")
    cfg = config(width, data, tied=tied, blocks=blocks)
    x = jnp.asarray(data.numpy_batch("train", [0])[0])
    per_example = loss_for("xent")
    spectral_tied = setup.init == "spectral" and tied
    if framework == "nnx":
        from flax import nnx

        # NNX shards a variable with sharding metadata when it is created, which needs a mesh: no FSDP names here.
        cfg = dataclasses.replace(cfg, fsdp_enabled=False)
        template = TransformerDoNNX(cfg, rngs=nnx.Rngs(0))
        geometry = so.GeometryMap.from_nnx(template, x)
        if spectral_tied:
            shapes = jax.eval_shape(lambda: nnx.state(template, nnx.Param))
            m = so.initializers.tied_readout_multiplier(shapes, geometry, base_width=setup.c)
            so.initializers.tied_readout_nnx(template, m)
        graphdef = nnx.graphdef(template)

        def own_init(key):
            return nnx.state(TransformerDoNNX(cfg, rngs=nnx.Rngs(params=key)), nnx.Param)

        def apply(params, x):
            return nnx.merge(graphdef, params)(x)

    else:
        module = TransformerDo(cfg)
        geometry = so.GeometryMap.from_linen(module, x)
        mult = None
        if spectral_tied:
            shapes = jax.eval_shape(lambda k: module.init(k, x)["params"], jax.random.key(0))
            mult = so.initializers.tied_readout_multiplier(shapes, geometry, base_width=setup.c)

        def own_init(key):
            return module.init(key, x)["params"]

        def apply(params, x):
            if mult is None:
                return module.apply({"params": params}, x)
            with so.initializers.tied_readout(mult):
                return module.apply({"params": params}, x)

    def init(key):
        k_own, k_new = jax.random.split(key)
        params = own_init(k_own)
        if setup.init == "own":
            return params
        return so.initializers.reinitialize(k_new, params, geometry, embedding_std=setup.s, warn_tied=False)

    def loss(params, x, y):
        return jnp.mean(per_example(apply(params, x), y))

    return Model(init, apply, loss), geometry


def optimizer_factory(setup: Setup, geometry_at, base):
    """``(lr, width) -> optax.GradientTransformation`` of ``setup``; ``geometry_at(width)``: the traced map,
    ``base``: the proxy's parameter shapes (``mup_adamw``'s ``base``)."""
    opt = registry(setup.optimizer)
    if opt.make is optax.adamw:
        return lambda lr, n: opt(lr, **setup.options)

    def make(lr, n):
        extra = {"base": base} if setup.optimizer == "mup_adamw" else {}
        tx = opt(lr, geometry=geometry_at(n), **extra, **setup.options)
        if setup.r == 1.0:
            return tx
        return optax.chain(tx, so.route_lr_scale(embedding=setup.r, geometry=geometry_at(n)))

    return make


def _scale(size, context: int, blocks: int) -> st.Scale:
    width, steps, batch = size
    return st.Scale(
        width=int(width), depth=int(blocks), steps=int(steps), batch_size=int(batch), sequence_length=context
    )


def _seed_mean(runs, lrs) -> list[float]:
    out = []
    for lr in lrs:
        v = [r["train_loss"] for r in runs if math.isclose(r["lr"], lr, rel_tol=1e-6)]
        bad = not v or any(x is None or not math.isfinite(x) for x in v)
        out.append(math.inf if bad else float(np.mean(v)))
    return out


def _edge_move(losses: Sequence[float], lo: float, hi: float, points: int) -> tuple[float, float] | None:
    """The grid's new index range when its best point is on an edge (``points`` more on that side), else None."""
    i = int(np.argmin(losses)) if any(math.isfinite(v) for v in losses) else -1
    if i == 0:
        return lo - points, hi
    if i == len(losses) - 1:
        return lo, hi + points
    return None


def run(
    preset: Mapping,
    *,
    out: str | os.PathLike = "out",
    setups: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    tag: str = "",
    progress: bool = True,
    framework: str = "linen",
) -> dict:
    """Run the recipe of ``preset`` (a :data:`PRESETS` entry) on the Linen or the NNX model (``framework``);
    resumable (``OUT/third_party_lm.jsonl``).

    Returns ``{model: {setup: {'proxy': {...}, 'targets': {width: {...}}}}}``; a target's entry holds
    ``proxy_lr``, ``lr`` (transferred), ``lr_factor``, ``naive_lr``, ``grid``, ``best_lr`` (refined),
    ``best_loss`` (the target's own best), ``loss`` (at the transferred LR), ``regret`` / ``regret_steps``,
    ``naive_regret`` / ``naive_regret_steps``, ``per_seed`` (regret per seed), ``at_edge`` and ``vs_adamw`` /
    ``best_vs_adamw`` (the loss at the transferred LR / the own best minus the baseline's best at the target).
    """
    setups = list(setups or preset["setups"])
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        raise ValueError(f"unknown setups {unknown}; have {list(SETUPS)}")
    if BASELINE not in setups:
        setups.append(BASELINE)  # every verdict is against it
    models = list(models or preset["models"])
    seeds = [int(s) for s in (seeds if seeds is not None else range(preset["seeds"]))]
    context, blocks = int(preset["context"]), int(preset["blocks"])
    data = load("text", context=context, sequence=True)
    results = os.path.join(os.fspath(out), "third_party_lm.jsonl")
    proxy = _scale(preset["proxy"], context, blocks)
    targets = [_scale(t, context, blocks) for t in preset["targets"]]
    root = math.sqrt(2.0)
    report: dict = {}
    for model_name in models:
        tied = model_name == "tied"
        cache: dict = {}

        def built(width, setup, tied=tied, cache=cache):
            if (width, setup) not in cache:
                cache[width, setup] = make_model(
                    width, data, tied=tied, blocks=blocks, setup=SETUPS[setup], framework=framework
                )
            return cache[width, setup]

        def train(name, width, steps, batch, lrs, built=built, model_name=model_name):
            setup = SETUPS[name]
            base = built(proxy.width, name)[0].shapes()
            factory = optimizer_factory(setup, lambda n: built(n, name)[1], base)
            run_tag = f"{model_name}/ctx{context}/N{blocks}{'' if framework == 'linen' else '/' + framework}{tag}"
            settings = {"steps": steps, "batch_size": batch, "seeds": seeds, "results": results, "progress": progress}
            model_at = lambda n: built(n, name)[0]
            return _runs_at_width(
                model_at, factory, width, lrs, data, name, run_tag, eval_examples=preset["eval_examples"], **settings
            )

        rows: dict = {}
        for name in setups:
            setup = SETUPS[name]
            center = registry(setup.optimizer).center(model_name) * setup.center_scale
            n = int(preset["proxy_lrs"])
            lo, hi = -(n - 1) / 2, (n - 1) / 2  # exponents of 2 around the centre
            for attempt in range(int(preset["moves"]) + 1):
                grid = [center * 2.0**k for k in np.arange(lo, hi + 1)]
                runs = train(name, proxy.width, proxy.steps, proxy.batch_size, grid)
                moved = _edge_move(_seed_mean(runs, grid), lo, hi, 2)
                if moved is None or attempt == int(preset["moves"]):
                    break
                lo, hi = moved
            s = summarize(runs)
            lr0 = float(s["best_lr_grid"][proxy.width])
            rows[name] = {
                "proxy": {
                    "scale": dataclasses.asdict(proxy),
                    "grid": grid,
                    "lr": lr0,
                    "best_lr": float(s["best_lr"][proxy.width]),
                    "loss": float(s["loss_at_best"][proxy.width]),
                    "at_edge": bool(s["at_edge"]),
                },
                "targets": {},
            }
            for target in targets:
                t = st.transfer({"learning_rate": lr0}, proxy, target)
                lr = float(t["learning_rate"])
                half = int(preset["target_half"])
                klo, khi = -half, half
                for attempt in range(int(preset["moves"]) + 1):
                    tgrid = [lr * root**k for k in range(klo, khi + 1)]
                    truns = train(name, target.width, target.steps, target.batch_size, [*tgrid, lr0])
                    moved = _edge_move(_seed_mean(truns, tgrid), klo, khi, 2)
                    if moved is None or attempt == int(preset["moves"]):
                        break
                    klo, khi = int(moved[0]), int(moved[1])
                at = regret(truns, lr, grid=tgrid, reference="all")
                naive = regret(truns, lr0, grid=tgrid, reference="all")
                rows[name]["targets"][target.width] = {
                    "scale": dataclasses.asdict(target),
                    "proxy_lr": lr0,
                    "lr": lr,
                    "lr_factor": t.lr_factor(),
                    "account": str(t),
                    "naive_lr": lr0,
                    "grid": tgrid,
                    "best_lr": at["best_lr"],
                    "best_loss": at["best_loss"],
                    "loss": at["loss"],
                    "regret": at["regret"],
                    "regret_steps": at["regret_steps"],
                    "naive_regret": naive["regret"],
                    "naive_regret_steps": naive["regret_steps"],
                    "per_seed": {str(k): v for k, v in at["per_seed"].items()},
                    "at_edge": _edge_move(_seed_mean(truns, tgrid), 0, 0, 0) is not None,
                }
        for row in rows.values():
            for width, tr in row["targets"].items():
                ref = rows[BASELINE]["targets"][width]["best_loss"]
                tr["adamw_best"] = ref
                tr["vs_adamw"] = tr["loss"] - ref
                tr["best_vs_adamw"] = tr["best_loss"] - ref
        report[model_name] = rows
    return report


#: ``mup_adamw``'s diagnosis (issue 50, item 2): the guide's tied path with one candidate changed at a time, at
#: one target, beside the baseline. ``own_init``: ``mup_adamw``'s per-layer LRs on the model's own init (no
#: ``reinitialize``, no read-out multiplier, ``r = 1``); ``own_tables_at_{D}``: Parametrization 1 for the
#: matrices but the tables at the model's own ``N(0, 1 / D)`` and no read-out multiplier (``c = D``,
#: ``s = D^-1/2``; only meaningful at width ``D``); ``r1`` / ``r4``: the tables' LR multiplier; ``c1`` / ``c16``:
#: the read-out's constant; ``wd0``: no weight decay; ``eps1e-12``: Adam's epsilon.
MUP_VARIANTS: Mapping[str, Setup] = {
    "tied_path": SETUPS["mup_adamw"],
    BASELINE: SETUPS[BASELINE],
    "own_init": Setup("mup_adamw", init="own"),
    "r1": dataclasses.replace(SETUPS["mup_adamw"], r=1.0),
    "r4": dataclasses.replace(SETUPS["mup_adamw"], r=4.0),
    "c1": dataclasses.replace(SETUPS["mup_adamw"], c=1.0),
    "c16": dataclasses.replace(SETUPS["mup_adamw"], c=16.0),
    "wd0": dataclasses.replace(SETUPS["mup_adamw"], options={"weight_decay": 0.0}),
    "eps1e-12": dataclasses.replace(SETUPS["mup_adamw"], options={"eps": 1e-12}),
    **{
        f"own_tables_at_{d}": dataclasses.replace(SETUPS["mup_adamw"], c=float(d), s=d**-0.5)
        for d in (32, 64, 128, 256)
    },
}


#: MOGA's route balance (issue 50, item 4), at one target beside Muon and the baseline. ``base_factor`` is the
#: whole balance between the hidden rows and every other route (read-out, sign / Adam on tables, gains and
#: biases) at one learning rate: scaling the other routes by ``b`` is the optimizer with ``base_factor / b`` at
#: learning rate ``x b``. ``tied_path_bf{B}``: the guide's tied path (:data:`SETUPS` ``'moga'``, tuned at the
#: proxy with ``base_factor = 1``) at ``base_factor = B``; ``published``: the authors' recipe on the model's own
#: init (``base_factor = 20``, weight decay 0.1, EMA momentum 0.95, sign on tables and vectors, the published
#: head; run it with ``tied=False``, their untied head); ``muon_own`` and the baseline as in :data:`SETUPS`.
MOGA_VARIANTS: Mapping[str, Setup] = {
    **{
        f"tied_path_bf{b:g}": dataclasses.replace(
            SETUPS["moga"], options={**SETUPS["moga"].options, "base_factor": float(b)}
        )
        for b in (1, 5, 25)
    },
    "published": Setup("moga_own", init="own", options={"base_factor": 20.0, "weight_decay": 0.1}),
    "muon_own": SETUPS["muon_own"],
    BASELINE: SETUPS[BASELINE],
}

#: The studies :func:`diagnose` runs: their variant tables.
STUDIES: Mapping[str, Mapping[str, Setup]] = {"mup_adamw": MUP_VARIANTS, "moga": MOGA_VARIANTS}


def _runs_at_width(model_at, factory, width: int, lrs, data, name: str, tag: str, **settings) -> list[dict]:
    """The runs of :func:`~spectral_optax.lab.sweep` of optimizer ``name`` at one width, warm-up cosine schedule
    (``settings``: its other keywords)."""
    kw = {"name": name, "tag": tag, "size_name": "width", "schedule": "warmup_cosine", **settings}
    return sweep(model_at, factory, [width], lrs, data, **kw).runs


def _constant(value, size):
    return value


def diagnose(
    variants: Sequence[str],
    *,
    width: int,
    steps: int,
    batch_size: int,
    lrs: Mapping[str, Sequence[float]],
    seeds: Sequence[int] = (0,),
    base_width: int = 32,
    context: int = 64,
    blocks: int = 2,
    tied: bool = True,
    out: str | os.PathLike = "out",
    progress: bool = True,
    study: str = "mup_adamw",
) -> dict:
    """Train each of ``variants`` of :data:`STUDIES` ``[study]`` at one target over its LRs (``lrs[variant]``,
    or ``lrs['*']``); ``mup_adamw``'s ``base`` is the model at ``base_width``. Returns ``{variant: {'lrs',
    'loss' (seed mean per LR), 'per_seed', 'best_lr', 'best_loss', 'curve_steps', 'curve' (the seed-mean train
    loss curve at the best LR), 'tokens_per_step'}}``; resumable (``OUT/third_party_lm_diagnose.jsonl``).
    """
    if study not in STUDIES:
        raise ValueError(f"diagnose: study must be one of {list(STUDIES)}, got {study!r}")
    table = STUDIES[study]
    unknown = [v for v in variants if v not in table]
    if unknown:
        raise ValueError(f"diagnose: unknown {study} variants {unknown}; have {list(table)}")
    data = load("text", context=context, sequence=True)
    results = os.path.join(os.fspath(out), "third_party_lm_diagnose.jsonl")
    settings = {"steps": steps, "batch_size": batch_size, "seeds": seeds, "results": results, "progress": progress}
    report = {}
    for name in variants:
        setup = table[name]
        model, geometry = make_model(width, data, tied=tied, blocks=blocks, setup=setup)
        base = make_model(base_width, data, tied=tied, blocks=blocks, setup=setup)[0].shapes()
        grid = [float(x) for x in lrs.get(name, lrs.get("*", ()))]
        factory = optimizer_factory(setup, functools.partial(_constant, geometry), base)
        tag = f"{'tied' if tied else 'untied'}/ctx{context}/N{blocks}/base{base_width}"
        model_at = functools.partial(_constant, model)
        runs = _runs_at_width(model_at, factory, width, grid, data, name, tag, eval_examples=256, **settings)
        loss = _seed_mean(runs, grid)
        i = int(np.argmin(loss))
        at_best = [r for r in runs if math.isclose(r["lr"], grid[i], rel_tol=1e-6) and r.get("curve")]
        report[name] = {
            "curve_steps": at_best[0]["curve_steps"] if at_best else [],
            "curve": np.mean([r["curve"] for r in at_best], axis=0).tolist() if at_best else [],
            "tokens_per_step": batch_size * context,
            "lrs": grid,
            "loss": loss,
            "per_seed": {
                int(sd): _seed_mean([r for r in runs if r["seed"] == sd], grid)
                for sd in sorted({r["seed"] for r in runs})
            },
            "best_lr": grid[i],
            "best_loss": loss[i],
        }
    return report
