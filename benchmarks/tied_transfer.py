"""Tied-embedding LMs under Parametrization 1: does the LR transfer, and does the model train as well as SP AdamW?

A decoder in the style of google-deepmind/nanodo's ``model.py`` (written here,
not vendored): learned positions, pre-norm blocks with ``DenseGeneral``
attention heads of size 16, a GELU MLP, logits by the tied ``embed.attend``
(``--models tied``) or a separate ``Dense`` head (``untied``). Byte-level
next-byte prediction at every position on Python's bundled documentation
(``pydoc_data``, :func:`spectral_optax.lab.text` with ``sequence=True``),
warm-up + cosine schedule, an LR grid of factor-2 points.

Per model and optimizer: tune at the narrowest width, evaluate at the wider
ones: the **spread** of the best LR in grid steps, the **regret** at the
widest width of training at the narrowest's best grid LR (nats, train loss,
:func:`spectral_optax.lab.regret`), and the train loss at the best LR per
width. The package's optimizers (``muon``, ``moga``, ``mup_adamw``) run on
the model as a user who cannot edit it would: params redrawn by
``so.initializers.reinitialize`` from ``so.GeometryMap.from_linen``'s trace
and, for the tied table, the read-out multiplier ``1 / d`` applied by
``so.initializers.tied_readout`` (docs/math.md, "Tied embeddings"); the
baseline ``adamw_sp`` is ``optax.adamw`` on the model's own (Flax default)
init, ``muon_own`` Muon on the model's own init (no reinitialize, no
multiplier), ``moga_adam_tables`` an ablation (MOGA with Adam instead of sign
steps on the tables, norm scales and biases). ``--readout-base-width c``
sets the tied multiplier to ``c / d`` (muP's ``output_mult``; default 1).

    python -m benchmarks.tied_transfer [--quick | --preset quick|default] [--json PATH] [--out DIR]
        [--models tied,untied] [--optimizers a,b] [--widths 32,128] [--steps N] [--seeds K] [--num-lrs N]
        [--readout-base-width C] [--centers name=lr,...]

Targets (issue 35): spread <= 0.5 grid steps, regret <= 0.01 nats, and the
widest model's loss at its best LR no worse than ``adamw_sp``'s best.
Runs are appended to ``OUT/tied_transfer.jsonl`` (an interrupted run
resumes).
"""

from __future__ import annotations

import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import spectral_optax as so
from benchmarks import _common
from benchmarks.width_transfer import widest_regret
from spectral_optax import lab

PRESETS = {
    # widths (the first is the proxy), LR-grid points, steps, seeds, context, batch size
    "quick": {"widths": [32, 128], "num_lrs": 5, "steps": 80, "seeds": 2, "context": 32, "batch_size": 8},
    "default": {"widths": [32, 128, 256], "num_lrs": 6, "steps": 150, "seeds": 2, "context": 64, "batch_size": 16},
}
#: Per optimizer: the init it runs on and its LR grid centers (peak LR) on the tied and the untied model. The
#: tied model's muP-family centers are 2x-4x the untied ones: its read-out moves by the table's steps times
#: ``1 / d`` (a slower read-out at the proxy than the untied head), and the grid must hold the best LR at every width.
OPTIMIZERS = {
    "muon": ("spectral", {"tied": 0.08, "untied": 0.04}),
    "moga": ("spectral", {"tied": 0.032, "untied": 0.016}),
    "mup_adamw": ("spectral", {"tied": 0.032, "untied": 0.016}),
    "moga_adam_tables": ("spectral", {"tied": 0.032, "untied": 0.016}),
    "adamw_sp": ("own", {"tied": 0.008, "untied": 0.008}),
    "muon_own": ("own", {"tied": 0.04, "untied": 0.04}),
}
DEFAULT_OPTIMIZERS = ("muon", "moga", "mup_adamw", "adamw_sp")


class Block(nn.Module):
    d: int
    head_dim: int = 16

    @nn.compact
    def __call__(self, x):
        heads = self.d // self.head_dim
        h = nn.LayerNorm()(x)
        q, k, v = (nn.DenseGeneral((heads, self.head_dim), name=n)(h) for n in ("query", "key", "value"))
        t = x.shape[1]
        mask = jnp.tril(jnp.ones((t, t), bool))
        w = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(self.head_dim)
        w = nn.softmax(jnp.where(mask, w, -1e9), axis=-1)
        a = jnp.einsum("bhqk,bkhd->bqhd", w, v)
        x = x + nn.DenseGeneral(self.d, axis=(-2, -1), name="attn_out")(a)
        h = nn.LayerNorm()(x)
        return x + nn.Dense(self.d, name="mlp_out")(nn.gelu(nn.Dense(4 * self.d, name="mlp_in")(h)))


class Decoder(nn.Module):
    """nanodo-style decoder: ``tied=True`` reads the logits out by ``embed.attend``."""

    d: int
    context: int
    vocab: int = 256
    layers: int = 2
    tied: bool = True

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.d, name="embed")
        pos = self.param("pos_embed", nn.initializers.normal(0.02), (self.context, self.d))
        x = embed(tokens) + pos[: tokens.shape[1]]
        for i in range(self.layers):
            x = Block(self.d, name=f"block_{i}")(x)
        x = nn.LayerNorm(name="out_norm")(x)
        return embed.attend(x) if self.tied else nn.Dense(self.vocab, name="head")(x)


def make_model(d: int, data, *, tied: bool, init: str, readout_base: float = 1.0):
    """``(lab.Model, geometry)`` of the decoder at width ``d``.

    ``init='own'``: Flax's default init, the model as written. ``'spectral'``:
    ``reinitialize`` from the traced geometry and, when tied, the read-out
    multiplier ``readout_base / d`` around every apply (:func:`so.initializers.tied_readout`).
    """
    module = Decoder(d, data.context, tied=tied)
    x, _ = data.numpy_batch("train", [0])
    own = lab.Model.from_linen(module, x, "xent")
    geometry = so.GeometryMap.from_linen(module, jnp.asarray(x))
    if init == "own":
        return own, geometry
    mult = so.initializers.tied_readout_multiplier(own.shapes(), geometry, base_width=readout_base) if tied else None
    per_example = lab.loss_for("xent")

    def init_fn(key):
        k_own, k_new = jax.random.split(key)
        return so.initializers.reinitialize(k_new, own.init(k_own), geometry)

    def apply(params, x):
        if mult is None:
            return own.apply(params, x)
        with so.initializers.tied_readout(mult):
            return own.apply(params, x)

    def loss(params, x, y):
        return jnp.mean(per_example(apply(params, x), y))

    return lab.Model(init_fn, apply, loss), geometry


def optimizer_factory(name: str, geometry_at, base):
    """``(lr, width) -> optax.GradientTransformation``; ``geometry_at(width)`` is the traced map."""
    if name in ("muon", "muon_own"):
        return lambda lr, n: so.muon(lr, geometry=geometry_at(n))
    if name == "moga":
        return lambda lr, n: so.moga(lr, geometry=geometry_at(n))
    if name == "moga_adam_tables":  # an ablation: Adam, not sign steps, on the tables and the norm scales / biases
        rules = {r"(embedding|pos_embed|scale|bias)$": "adam"}
        return lambda lr, n: so.moga(lr, geometry=geometry_at(n), rules=rules)
    if name == "mup_adamw":
        return lambda lr, n: so.mup_adamw(lr, base=base, geometry=geometry_at(n))
    if name == "adamw_sp":
        return lambda lr, n: optax.adamw(lr, weight_decay=1e-4)
    raise ValueError(f"unknown optimizer {name!r}; have {sorted(OPTIMIZERS)}")


def run(
    *,
    models=("tied", "untied"),
    optimizers=DEFAULT_OPTIMIZERS,
    widths,
    num_lrs,
    steps,
    seeds,
    context,
    batch_size,
    out="out",
    tag="",
    progress=True,
    readout_base=1.0,
    centers=None,
):
    """Sweep every (model, optimizer); returns ``{model: {'summary': ..., 'regret': ..., 'results': ...}}``."""
    data = lab.load("text", context=context, sequence=True)
    results_path = os.path.join(out, "tied_transfer.jsonl")
    report = {}
    for model_name in models:
        tied = model_name == "tied"
        cache: dict = {}

        def built(d, init, tied=tied, cache=cache):
            if (d, init) not in cache:
                cache[d, init] = make_model(d, data, tied=tied, init=init, readout_base=readout_base)
            return cache[d, init]

        base = built(widths[0], "spectral")[0].shapes()
        results, summaries = {}, {}
        for name in optimizers:
            init, center = OPTIMIZERS[name][0], (centers or {}).get(name, OPTIMIZERS[name][1][model_name])
            factory = optimizer_factory(name, lambda d, init=init: built(d, init)[1], base)
            res = lab.sweep(
                lambda d, init=init: built(d, init)[0],
                factory,
                widths,
                lab.lr_grid(center, num_lrs),
                data,
                steps=steps,
                batch_size=batch_size,
                seeds=seeds,
                results=results_path,
                name=name,
                tag=f"{model_name}/ctx{context}{tag}" + (f"/rb{readout_base:g}" if readout_base != 1 else ""),
                size_name="width",
                schedule="warmup_cosine",
                progress=progress,
            )
            results[name], summaries[name] = res, res.summary()
        report[model_name] = {"summary": summaries, "regret": widest_regret(results, summaries), "results": results}
    return report


def print_report(report, widths) -> None:
    for model_name, r in report.items():
        base_best = r["summary"].get("adamw_sp", {}).get("loss_at_best", {}).get(widths[-1])
        print(
            f"\n{model_name}: spread (grid steps), regret at {widths[-1]} with {widths[0]}'s best grid LR, train loss"
        )
        print(f"  {'optimizer':10s} {'best LR per width':>28s} {'spread':>7s} {'regret':>8s}  loss@best per width")
        for name, s in r["summary"].items():
            lrs = " ".join(f"{s['best_lr'][w]:.3g}" for w in widths)
            reg = r["regret"].get(name, {}).get("regret", float("nan"))
            losses = " ".join(f"{s['loss_at_best'][w]:.3f}" for w in widths)
            vs = ""
            if base_best is not None and name != "adamw_sp":
                vs = f"  ({s['loss_at_best'][widths[-1]] - base_best:+.3f} vs adamw_sp at {widths[-1]})"
            edge = f"  edge: {sorted(s['at_edge'])}" if s["at_edge"] else ""
            print(f"  {name:10s} {lrs:>28s} {s['spread_steps']:7.2f} {reg:+8.4f}  {losses}{vs}{edge}")


def main(argv=None):
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="sizes (--quick = --preset quick)")
    p.add_argument("--models", default="tied,untied")
    p.add_argument("--optimizers", default=",".join(DEFAULT_OPTIMIZERS), help=f"of {sorted(OPTIMIZERS)}")
    p.add_argument("--widths", default=None)
    p.add_argument("--num-lrs", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument(
        "--readout-base-width",
        type=float,
        default=1.0,
        help="c of the tied read-out multiplier c / d (tied_readout_multiplier's base_width; default 1: 1 / d)",
    )
    p.add_argument("--centers", default=None, help="LR grid centers, e.g. muon=0.04,moga=0.016 (both models)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    preset = args.preset or ("quick" if args.quick else "default")
    cfg = dict(PRESETS[preset])
    if args.widths:
        cfg["widths"] = [int(w) for w in args.widths.split(",")]
    for k in ("num_lrs", "steps", "seeds"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    cfg["seeds"] = list(range(cfg["seeds"]))
    models = args.models.split(",")
    optimizers = args.optimizers.split(",")
    unknown = [o for o in optimizers if o not in OPTIMIZERS] + [m for m in models if m not in ("tied", "untied")]
    if unknown:
        raise SystemExit(
            f"unknown optimizers or models {unknown}; optimizers: {sorted(OPTIMIZERS)}, models: tied,untied"
        )
    print(f"tied transfer ({preset}): {cfg}, models {models}, optimizers {optimizers}, backend {jax.default_backend()}")
    t0 = time.time()
    with jax.default_matmul_precision("highest"):
        report = run(
            models=models,
            optimizers=optimizers,
            out=args.out,
            tag="/quick" if preset == "quick" else "",
            progress=not args.no_progress,
            readout_base=args.readout_base_width,
            centers={k: float(v) for k, v in (kv.split("=") for kv in args.centers.split(","))}
            if args.centers
            else None,
            **cfg,
        )
    print_report(report, cfg["widths"])
    elapsed = time.time() - t0
    print(f"\n({elapsed:.0f} s)")
    _common.write_json(
        args.json,
        {
            "benchmark": "tied_transfer",
            "preset": preset,
            **cfg,
            "models": models,
            "readout_base_width": args.readout_base_width,
            "summary": {
                m: {
                    k: {kk: s[kk] for kk in ("best_lr", "spread_steps", "loss_at_best", "best_lr_grid", "at_edge")}
                    for k, s in r["summary"].items()
                }
                for m, r in report.items()
            },
            "regret": {m: r["regret"] for m, r in report.items()},
            "runs": {m: [x for res in r["results"].values() for x in res.runs] for m, r in report.items()},
            "seconds": elapsed,
            "environment": _common.environment(),
        },
    )
    return report


if __name__ == "__main__":
    main()
