"""The tied-embedding study (``benchmarks.tied_transfer``): its decoder as the package's optimizers see it, the
Theta(1) constants muTransfer tunes at the proxy width, and the optimizers they configure.

:func:`make_model` is ``lab.Decoder`` with a tied (``embed.attend``) or untied read-out, on the model's own
Flax init or redrawn by ``so.initializers.reinitialize`` from the traced geometry with the tied read-out's
multiplier ``c / d`` (``so.initializers.tied_readout``); :func:`optimizer_factory` is the lab registry's
optimizer with the constants of :data:`DEFAULT_CONSTANTS` applied to its routes; :data:`TUNE_GRID` /
:func:`tune_grid` the combinations ``--tune`` sweeps at the proxy width. Public API only.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

import spectral_optax as so
from spectral_optax.lab._decoder import Decoder
from spectral_optax.lab._models import Model, loss_for
from spectral_optax.lab._registry import optimizer

#: The lab registry's optimizers the tied study runs (their ``tied`` / ``untied`` LR-grid centres; those on the
#: ``'standard'`` init run on the model's own Flax init).
OPTIMIZERS = ("muon", "moga", "mup_adamw", "moga_adam_tables", "adamw_sp", "muon_own", "moga_own")
DEFAULT_OPTIMIZERS = ("muon", "moga", "mup_adamw", "adamw_sp")


#: The Theta(1) constants of a run (muTransfer tunes them at the proxy and keeps them at every width):
#: ``rb``: the tied read-out's ``c`` (multiplier ``c / d``; microsoft/mup's ``output_mult``); ``emb``: the LR
#: multiplier of the tables (route 'embedding': the tied table, the positions; muP's per-group multiplier,
#: ``so.route_lr_scale``; for ``muon`` it equals ``adam_learning_rate = emb * lr`` on the tables);
#: ``bf``: ``moga``'s ``base_factor`` (the hidden matrices' step over the tables' and vectors' sign steps);
#: ``hb``: ``moga``'s head rule, 0 the published one, 1 ``head_base_width`` = the proxy's width; ``adam``:
#: ``moga``'s tables, norm scales and biases by Adam (``rules=``, at the same LR) instead of sign steps;
#: ``norm``: 1 puts the tables (the tied table, the positions) on their own dual map, every token's row to
#: RMS 1 after momentum (``muon``'s ``embedding='normalize'``; for ``moga`` a ``rules=`` entry of
#: ``so.scale_by_fan_out_rms``), the map that the lookup and the row-wise read-out share (docs/math.md,
#: "Tied embeddings").
#: ``es``: the tables' init standard deviation (``reinitialize``'s ``embedding_std``: the lookup's Theta(1)
#: entry size).
DEFAULT_CONSTANTS: dict[str, float] = {
    "rb": 1.0,
    "emb": 1.0,
    "bf": 25.0,
    "hb": 0.0,
    "adam": 0.0,
    "norm": 0.0,
    "es": 1.0,
}
#: ``--tune``: the grid of constants tried at the proxy width per optimizer (every combination; ``rb`` only on
#: the tied model). The LR grid is moved by two points while the proxy's best LR is on its edge.
TUNE_GRID: dict[str, dict[str, tuple[float, ...]]] = {
    "muon": {"rb": (1.0, 4.0), "emb": (1.0, 4.0), "es": (1.0, 0.25)},
    "mup_adamw": {"rb": (1.0, 4.0, 16.0), "emb": (1.0, 4.0, 16.0, 64.0)},
    "moga": {"rb": (1.0, 4.0, 16.0), "bf": (25.0, 5.0, 1.0), "adam": (0.0, 1.0), "hb": (1.0,), "emb": (1.0, 4.0)},
}


def constants_tag(consts) -> str:
    """The resume-tag suffix of the constants that differ from :data:`DEFAULT_CONSTANTS`."""
    return "".join(f"/{k}{consts[k]:g}" for k, v in DEFAULT_CONSTANTS.items() if consts.get(k, v) != v)


def constants_for(name: str, readout_base: float, constants: dict | None) -> dict:
    """The constants of ``name``: :data:`DEFAULT_CONSTANTS`, ``rb`` from ``--readout-base-width``, then
    ``--constants`` (which wins over both)."""
    return {**DEFAULT_CONSTANTS, "rb": float(readout_base), **(constants or {}).get(name, {})}


def tune_grid(name: str, tied: bool) -> list[dict]:
    """Every combination of :data:`TUNE_GRID` ``[name]`` (``rb`` dropped when untied, ``hb`` when tied)."""
    combos = [dict(DEFAULT_CONSTANTS)]
    for key, values in TUNE_GRID.get(name, {}).items():
        if (key == "rb" and not tied) or (key == "hb" and tied):
            continue
        combos = [dict(c, **{key: float(v)}) for c in combos for v in values]
    return combos


def make_model(d: int, data, *, tied: bool, init: str, readout_base: float = 1.0, embedding_std: float = 1.0):
    """``(lab.Model, geometry)`` of the decoder at width ``d``.

    ``init='own'``: Flax's default init, the model as written. ``'spectral'``:
    ``reinitialize`` from the traced geometry and, when tied, the read-out
    multiplier ``readout_base / d`` around every apply (:func:`so.initializers.tied_readout`); the tables'
    entries are ``N(0, embedding_std^2)``.
    """
    module = Decoder(d, context=data.context, tied=tied)
    x, _ = data.numpy_batch("train", [0])
    own = Model.from_linen(module, x, "xent")
    geometry = so.GeometryMap.from_linen(module, jnp.asarray(x))
    if init == "own":
        return own, geometry
    mult = so.initializers.tied_readout_multiplier(own.shapes(), geometry, base_width=readout_base) if tied else None
    per_example = loss_for("xent")

    def init_fn(key):
        k_own, k_new = jax.random.split(key)
        # warn_tied: the apply below multiplies the tied read-out (the fix the warning asks for)
        return so.initializers.reinitialize(
            k_new, own.init(k_own), geometry, embedding_std=embedding_std, warn_tied=mult is None
        )

    def apply(params, x):
        if mult is None:
            return own.apply(params, x)
        with so.initializers.tied_readout(mult):
            return own.apply(params, x)

    def loss(params, x, y):
        return jnp.mean(per_example(apply(params, x), y))

    return Model(init_fn, apply, loss), geometry


def optimizer_factory(name: str, geometry_at, base, consts=None, proxy_width=None):
    """``(lr, width) -> optax.GradientTransformation``; ``geometry_at(width)`` is the traced map.

    ``consts`` (:data:`DEFAULT_CONSTANTS` keys): ``emb`` multiplies the tables' updates
    (``so.route_lr_scale``), ``bf`` / ``hb`` set ``moga``'s ``base_factor`` / ``head_base_width``."""
    c = dict(DEFAULT_CONSTANTS, **(consts or {}))

    def tables(opt_fn):
        if c["emb"] == 1.0:
            return opt_fn
        return lambda lr, n: optax.chain(opt_fn(lr, n), so.route_lr_scale(embedding=c["emb"], geometry=geometry_at(n)))

    opt = optimizer(name)
    if name in ("muon", "muon_own"):
        route = "normalize" if c["norm"] else "adamw"
        return tables(lambda lr, n: opt(lr, geometry=geometry_at(n), embedding=route))
    if name in ("moga", "moga_adam_tables", "moga_own"):
        head = None if not c["hb"] else float(proxy_width)
        # moga_adam_tables, an ablation: Adam, not sign steps, on the tables and the norm scales / biases
        adam = name == "moga_adam_tables" or c["adam"]

        def rules(n):
            out = {}
            if c["norm"]:
                normalize = optax.chain(optax.ema(0.95, debias=False), so.scale_by_fan_out_rms(geometry=geometry_at(n)))
                out[r"(embedding|pos_embed)$"] = normalize
            if adam:
                out[r"(embedding|pos_embed|scale|bias)$"] = "adam"
            return out or None

        return tables(
            lambda lr, n: opt(lr, geometry=geometry_at(n), rules=rules(n), base_factor=c["bf"], head_base_width=head)
        )
    if name == "mup_adamw":
        return tables(lambda lr, n: opt(lr, base=base, geometry=geometry_at(n)))
    if name == "adamw_sp":
        return lambda lr, n: opt(lr)
    raise ValueError(f"unknown optimizer {name!r}; have {sorted(OPTIMIZERS)}")


def center_for(name: str, model_name: str, consts, centers) -> float:
    """The LR grid's center: ``--centers`` or the lab registry's for the model (``'tied'``, ``'untied'``),
    for ``moga`` times about ``sqrt(25 / bf)`` (a power of 2: the grids of every ``bf`` share their points)."""
    if centers and name in centers:
        return centers[name]
    center = optimizer(name).center(model_name)
    if name.startswith("moga"):
        center *= 2.0 ** round(math.log2(math.sqrt(DEFAULT_CONSTANTS["bf"] / consts["bf"])))
    return center


def parse_constants(text: str | None) -> dict:
    """``'muon:rb=4:emb=0.25,moga:bf=5'`` -> ``{'muon': {'rb': 4.0, 'emb': 0.25}, 'moga': {'bf': 5.0}}``."""
    out: dict = {}
    for item in (text or "").split(","):
        if not item:
            continue
        name, *pairs = item.split(":")
        if name not in OPTIMIZERS:
            raise SystemExit(f"--constants: unknown optimizer {name!r}; have {sorted(OPTIMIZERS)}")
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key not in DEFAULT_CONSTANTS or not value:
                raise SystemExit(
                    f"--constants: {pair!r} in {item!r}: want KEY=VALUE, KEY one of {list(DEFAULT_CONSTANTS)}"
                )
            out.setdefault(name, {})[key] = float(value)
    return out
