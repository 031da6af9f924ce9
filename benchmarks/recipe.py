"""Tune once, train bigger, longer and at a larger batch: the transfer recipe, judged by regret.

Tune the peak LR on a proxy, transfer it with :mod:`spectral_optax.transfer`
to a target (wider, longer, larger batch; for the GPT also deeper) and train
the target over its own LR grid, centred on the transferred LR. Printed per
optimizer: the account of the factors, and the target's **regret**
(:func:`spectral_optax.lab.regret`: its loss at the transferred LR minus the
best loss of its own sweep, in nats and in grid steps) for the full recipe,
with each rule switched off in turn, and for the naive transfer (the proxy's
LR unchanged). Width is transferred by the parametrization (``mup_adamw``,
``muon``) and depth by the residual branch multiplier ``2 / K``
(:func:`spectral_optax.lab.gpt_family`); SP AdamW (``optax.adamw``, Flax
init) is the control.

``--model mlp`` (default): the quickstart's byte-level MLP (one hidden layer,
context 8), depth not varied. ``--model gpt``: the package's GPT
(:class:`spectral_optax.nn.linen.Transformer`) on byte sequences.

``--study horizon``: the horizon rule alone. The proxy at ``T0``, targets at
``4 T0`` and ``16 T0`` (same width and batch); per seed, the best LR at each
horizon and the fitted exponent ``a`` in ``eta* ~ T^-a`` next to the
published 0.32; the regret of the rule and of the naive transfer.
``--study batch``: the batch rule alone, ``B0 -> 4 B0, 16 B0`` at equal tokens
(fewer steps). ``--study wd``: the weight-decay timescale rule alone, on
finite training sets read for the same number of epochs at every horizon
(the proxy's first ``train_examples`` windows, the target's as many times
more as it has tokens: the data grows with the run, as in "tune small, train
on more tokens", and decay can matter), judged on the validation loss. At the
proxy (``T0`` steps) the LR is tuned without decay on the train loss (as in
the horizon study), then ``lambda`` over a grid of timescales
``tau = 1 / (eta lambda)`` at that LR; at ``4 T0``
and ``16 T0`` (LR by the horizon rule) ``lambda`` is swept again, and the
rule's ``lambda' = lambda eta T / (eta' T')`` and the naive ``lambda``
(unchanged) are judged by regret in ``lambda``-grid steps, beside the loss
without decay (what decay gains at that horizon) and the fitted exponent
``c`` in ``lambda* ~ T^-c`` (the rule's is ``1 - a = 0.68``).

    python -m benchmarks.recipe [--quick] [--model mlp|gpt] [--study recipe|horizon|batch|wd]
        [--seeds K] [--optimizers a,b] [--controls off|add|only] [--json PATH] [--out DIR]
        [--proxy W,K,T,B] [--target LABEL=W,K,T,B ...] [--multiples 4,16] [--num-lrs N] [--train-examples N]

``--controls`` (on in the default presets): beside each target wider or
deeper than the proxy, the same horizon and batch at the proxy's width and
depth, so that the regret splits into the horizon and batch rules' share and
the width and depth transfer's.

Runs are appended to ``OUT/recipe.jsonl`` (an interrupted run resumes).
Outside ``--study wd`` weight decay stays at the optimizers' defaults
(``1e-4`` for SP AdamW on the MLP: a timescale far longer than these runs).
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax.numpy as jnp
import numpy as np

from spectral_optax import lab
from spectral_optax import transfer as st
from spectral_optax.lab import cli


def _preset(proxy, targets, num_lrs, seeds=2, **extra):
    return {"proxy": proxy, "targets": targets, "num_lrs": num_lrs, "seeds": seeds, **extra}


def _study(width, depth, steps, batch, multiples, num_lrs, seeds=2, **extra):
    shape = {"width": width, "depth": depth, "steps": steps, "batch": batch, "multiples": multiples}
    return {**shape, "num_lrs": num_lrs, "seeds": seeds, **extra}


#: Per model: presets of the recipe (proxy and targets as (width, depth, steps, batch); LR-grid points (x2);
#: seeds; ``controls``, see ``lab.transfer_controls``), the single-rule studies, and the proxy's LR-grid centres.
MODELS = {
    "mlp": {
        "presets": {
            "quick": _preset((64, 1, 150, 32), {"4 T0, 2 B0": (256, 1, 600, 64)}, 7),
            "default": _preset(
                (64, 1, 150, 32),
                {"8 T0, 4 B0": (512, 1, 1200, 128), "8 T0, B0": (512, 1, 1200, 32)},
                7,
                controls="add",
            ),
        },
        "studies": {
            "horizon": _study(128, 1, 150, 32, (4, 16), 7),
            "batch": _study(128, 1, 600, 8, (4, 16), 7),
            "wd": _study(128, 1, 600, 32, (4, 16), 7, train_examples=8192),
        },
        # the registry's experiment: the quickstart's best LRs at width 64, 150 steps, batch 32
        "experiment": "width_mlp",
    },
    "gpt": {
        "presets": {
            "quick": _preset((32, 2, 80, 8), {"4 T0, 2x width": (64, 2, 320, 8)}, 6),
            "default": _preset((32, 2, 80, 8), {"8 T0, B0, 4x width, 2x depth": (128, 4, 640, 8)}, 6, controls="add"),
        },
        "studies": {
            "horizon": _study(64, 2, 80, 8, (4, 16), 6),
            "batch": _study(64, 2, 320, 4, (4,), 6),
            "wd": _study(64, 2, 160, 8, (4,), 6, train_examples=8192),
        },
        # the registry's experiment: gpt_width's centres at width 32
        "experiment": "recipe_gpt",
    },
}
#: The GPT's context (tokens per sequence) and the MLP's (bytes per example).
CONTEXT = {"mlp": 8, "gpt": 32}
#: ``--study wd``: the ``lambda`` grid is centred on the timescale ``tau = T0`` at the proxy's LR
#: (``lambda = 1 / (eta T0)``) and spans ``tau / T0`` from 1/8 to 8 in factor-2 steps.
WD_TAU_FRACTION = 1.0
WD_POINTS = 7


def optimizers(model, family_for, base_width, weight_decay=None):
    """name -> (init, factory(lr, width)), the lab registry's ``mup_adamw``, ``muon`` and ``adamw_sp``;
    ``weight_decay``: a traced decay (``--study wd``) or ``None`` (no decay for the muP family; SP AdamW's
    registry default on the MLP, none on the GPT)."""
    base = family_for("spectral")(base_width).shapes()
    wd = {} if weight_decay is None else {"weight_decay": weight_decay}
    constants = lab.optimizer("mup_adamw").constants.get(MODELS[model]["experiment"], {})
    options = {
        "mup_adamw": {"base": base, "weight_decay": 0.0, **constants, **wd},
        "muon": {"compute_dtype": jnp.float32, **wd},
        "adamw_sp": wd or ({} if model == "mlp" else {"weight_decay": 0.0}),
    }
    out = {}
    for name, kw in options.items():
        opt = lab.optimizer(name)
        out[name] = (opt.init, lambda lr, n, opt=opt, kw=kw: opt(lr, **kw))
    return out


def centers(model: str) -> dict:
    """The proxy's LR-grid centres: the registry's, for the model's experiment."""
    return {name: lab.optimizer(name).center(MODELS[model]["experiment"]) for name in ("mup_adamw", "muon", "adamw_sp")}


def _on(grid, lr):
    return any(abs(lr - g) <= 1e-6 * g for g in grid)


def per_seed_best(runs, grid, metric="train_loss"):
    """seed -> refined best LR over ``grid``."""
    out = {}
    for seed in sorted({r["seed"] for r in runs}):
        rs = [r for r in runs if r["seed"] == seed and _on(grid, r["lr"])]
        out[seed] = lab.summarize(rs, metric=metric)["best_lr"][rs[0]["size"]]
    return out


def _curve(runs, values, metric="train_loss"):
    return {
        g: float(np.mean([r[metric] if r[metric] is not None else np.inf for r in runs if _on([g], r["lr"])]))
        for g in sorted(values)
    }


class Lab:
    def __init__(self, args, seeds, num_lrs, train_examples=None):
        self.model = args.model
        ctx = CONTEXT[args.model]
        self.data = (
            lab.load("text", context=ctx, flatten=True)
            if args.model == "mlp"
            else lab.load("text", context=ctx, sequence=True)
        )
        self.train_examples = train_examples
        self.sequence_length = 1 if args.model == "mlp" else ctx
        self.seeds, self.num_lrs, self.progress = seeds, num_lrs, not args.no_progress
        self.results = os.path.join(args.out, "recipe.jsonl")

    def scale(self, width, depth, steps, batch):
        return st.Scale(width=width, depth=depth, steps=steps, batch_size=batch, sequence_length=self.sequence_length)

    def family_for(self, init, depth=1):
        if self.model == "mlp":
            return lab.mlp_family(self.data, vary="width", depth=1, init=init)
        return lab.gpt_family(self.data, vary="width", depth=depth, init=init)

    def data_for(self, scale, proxy):
        """The training set of ``scale``: all of it, or (``--study wd``) the first ``train_examples`` windows
        times the tokens of ``scale`` over the proxy's, so that every run sees the same number of epochs."""
        if not self.train_examples:
            return self.data
        tokens = (scale.steps * scale.batch_size) / (proxy.steps * proxy.batch_size)
        return first_examples(self.data, round(self.train_examples * tokens))

    def sweep(self, name, init, factory, scale, lrs, tag="recipe", data=None):
        data = self.data if data is None else data
        with jax_highest():
            res = lab.sweep(
                self.family_for(init, scale.depth),
                factory,
                [scale.width],
                lrs,
                data,
                steps=scale.steps,
                batch_size=scale.batch_size,
                seeds=self.seeds,
                results=self.results,
                name=name if scale.depth in (1, 2) else f"{name}/K{scale.depth}",
                tag=tag,
                size_name="width",
                progress=self.progress,
            )
        return res.runs

    def transfer_study(self, name, init, factory, proxy, targets, variants, center):
        """Tune on ``proxy``, evaluate every variant's LR at each target.

        Returns ``{'proxy_lr', 'proxy_best': {seed: lr}, 'targets': {label: {...}}}``."""
        grid0 = lab.lr_grid(center, self.num_lrs)
        runs0 = self.sweep(name, init, factory, proxy, grid0)
        s0 = lab.summarize(runs0)
        lr0 = s0["best_lr"][proxy.width]
        out = {"proxy_lr": lr0, "proxy_best": per_seed_best(runs0, grid0), "proxy_edge": bool(s0["at_edge"])}
        out["targets"] = {}
        for label, target in targets.items():
            ts = {v: st.transfer({"learning_rate": lr0}, proxy, target, rules=r) for v, r in variants.items()}
            first = next(iter(ts))
            grid = lab.lr_grid(ts[first]["learning_rate"], self.num_lrs)
            extra = [t["learning_rate"] for t in ts.values() if not _on(grid, t["learning_rate"])]
            runs = self.sweep(name, init, factory, target, grid + extra)
            reg = {v: lab.regret(runs, t["learning_rate"], grid=grid, reference="all") for v, t in ts.items()}
            out["targets"][label] = {
                "scale": target,
                "transfer": ts,
                "regret": reg,
                "best": per_seed_best(runs, grid),
                "edge": lab.summarize([r for r in runs if _on(grid, r["lr"])])["at_edge"],
                "curve": _curve(runs, grid + extra),
            }
        return out

    def weight_decay_study(self, name, init, proxy, targets, center):
        """On finite training sets of a fixed number of epochs (the set grows with the run's tokens): the proxy's
        LR (no decay, train loss, as the horizon study), its best ``lambda`` on a timescale grid (validation loss),
        and per target (LR by the horizon rule) the validation regret of the rule's and the naive ``lambda`` on
        the target's own ``lambda`` sweep, and the loss without decay."""
        val = "val_loss"

        def family(init):
            return self.family_for(init, proxy.depth)

        def decayed(lr):
            return lambda lam, n: optimizers(self.model, family, proxy.width, weight_decay=lam)[name][1](lr, n)

        no_decay = optimizers(self.model, family, proxy.width, weight_decay=0.0)[name][1]
        data0 = self.data_for(proxy, proxy)
        grid0 = lab.lr_grid(center, self.num_lrs)
        runs0 = self.sweep(name, init, no_decay, proxy, grid0, tag="recipe-wd", data=data0)
        lr0 = lab.summarize(runs0)["best_lr"][proxy.width]
        lam_c = 1.0 / (WD_TAU_FRACTION * lr0 * proxy.steps)
        wgrid0 = lab.lr_grid(lam_c, WD_POINTS)
        tag0 = f"recipe-wd@{lr0:.6g}"
        wruns0 = self.sweep(name, init, decayed(lr0), proxy, wgrid0, tag=tag0, data=data0)
        s0 = lab.summarize(wruns0, metric=val)
        lam0 = s0["best_lr"][proxy.width]
        zero0 = self.sweep(name, init, decayed(lr0), proxy, [0.0], tag=tag0, data=data0)
        out = {
            "proxy_lr": lr0,
            "proxy_lambda": lam0,
            "proxy_edge": bool(s0["at_edge"]),
            "proxy_best": per_seed_best(wruns0, wgrid0, val),
            "proxy_curve": _curve(wruns0, wgrid0, val),
            "proxy_no_decay": float(np.mean([r[val] for r in zero0])),
            "proxy_train_examples": data0.num_train,
            "targets": {},
        }
        for label, target in targets.items():
            data = self.data_for(target, proxy)
            full = st.transfer({"learning_rate": lr0, "weight_decay": lam0}, proxy, target)
            lr1 = full["learning_rate"]
            cand = {"timescale rule": full["weight_decay"], "naive": lam0}
            grid = lab.lr_grid(cand["timescale rule"], WD_POINTS)
            extra = [v for v in cand.values() if not _on(grid, v)]
            tag = f"recipe-wd@{lr1:.6g}"
            runs = self.sweep(name, init, decayed(lr1), target, grid + extra, tag=tag, data=data)
            zero = self.sweep(name, init, decayed(lr1), target, [0.0], tag=tag, data=data)
            reg = {v: lab.regret(runs, lam, grid=grid, reference="all", metric=val) for v, lam in cand.items()}
            no_decay_val = float(np.mean([r[val] for r in zero]))
            out["targets"][label] = {
                "scale": target,
                "train_examples": data.num_train,
                "learning_rate": lr1,
                "transfer": full,
                "lambda": cand,
                "regret": reg,
                "best": per_seed_best(runs, grid, val),
                "edge": lab.summarize([r for r in runs if _on(grid, r["lr"])], metric=val)["at_edge"],
                "curve": _curve(runs, grid + extra, val),
                "train_curve": _curve(runs, grid + extra),
                "no_decay_loss": no_decay_val,
                "decay_gain": no_decay_val - min(_curve(runs, grid, val).values()),
                "no_decay_train": float(np.mean([r["train_loss"] for r in zero])),
            }
        return out


def first_examples(data, n):
    """``data`` with its training set cut to the first ``n`` examples (windows of the byte stream), so that
    a run of ``T`` steps at batch ``B`` sees ``T B / n`` epochs; the validation set is unchanged."""
    if n > data.num_train:
        raise ValueError(f"train_examples={n} is more than the dataset's {data.num_train}")
    (stream,) = data.train
    return dataclasses.replace(data, name=f"{data.name}[:{n}]", train=(stream[: n + data.context + 1],), num_train=n)


def jax_highest():
    import jax

    return jax.default_matmul_precision("highest")


def _fmt_regret(r):
    return f"{r['regret']:+.4f} nats {r['regret_steps']:+.2f} st" + (" (interp.)" if r["interpolated"] else "")


def fitted_exponents(res, axis, best_key="best", proxy_key="proxy_best"):
    """Per seed (and for the seed mean): ``-slope`` of log best value vs log(axis value)."""
    xs = [getattr(res["proxy_scale"], axis)] + [getattr(t["scale"], axis) for t in res["targets"].values()]
    seeds = sorted(res[proxy_key])
    per_seed = {}
    for s in seeds:
        ys = [res[proxy_key][s]] + [t[best_key][s] for t in res["targets"].values()]
        per_seed[s] = cli.loglog_slope(xs, ys)
    proxy_mean = res["proxy_lambda"] if "proxy_lambda" in res else res["proxy_lr"]
    mean = [proxy_mean] + [t["regret"][next(iter(t["regret"]))]["best_lr"] for t in res["targets"].values()]
    return {"per_seed": per_seed, "mean": cli.loglog_slope(xs, mean)}


def report(name, res, variants):
    print(
        f"\n{name}: proxy best LR {res['proxy_lr']:.4g} (per seed "
        + ", ".join(f"{v:.4g}" for v in res["proxy_best"].values())
        + ")"
        + ("  AT GRID EDGE" if res["proxy_edge"] else "")
    )
    for label, t in res["targets"].items():
        first = next(iter(t["transfer"]))
        print(
            f"  target {label}: best LR {t['regret'][first]['best_lr']:.4g} (per seed "
            + ", ".join(f"{v:.4g}" for v in t["best"].values())
            + f"), best loss {t['regret'][first]['best_loss']:.4f}"
            + ("  AT GRID EDGE" if t["edge"] else "")
        )
        print("    " + str(t["transfer"][first]).replace("\n", "\n    "))
        for v in variants:
            r = t["regret"][v]
            print(
                f"    {v:14s} lr {r['lr']:.4g}  loss {r['loss']:.4f}  regret {_fmt_regret(r)}  per seed "
                + " ".join(f"{x:+.4f}" for x in r["per_seed"].values())
            )


def report_wd(name, res):
    print(
        f"\n{name}: proxy LR {res['proxy_lr']:.4g} (no decay), best lambda {res['proxy_lambda']:.4g} (per seed "
        + ", ".join(f"{v:.4g}" for v in res["proxy_best"].values())
        + f"; tau = 1/(eta lambda) = {1 / (res['proxy_lr'] * res['proxy_lambda']):.0f} steps"
        + f" of {res['proxy_scale'].steps}); val loss {min(res['proxy_curve'].values()):.4f}, without decay"
        + f" {res['proxy_no_decay']:.4f}"
        + ("  AT GRID EDGE" if res["proxy_edge"] else "")
    )
    for label, t in res["targets"].items():
        r0 = t["regret"]["timescale rule"]
        print(
            f"  target {label} (LR {t['learning_rate']:.4g} by the horizon rule): best lambda {r0['best_lr']:.4g} "
            f"(per seed " + ", ".join(f"{v:.4g}" for v in t["best"].values()) + f"), best val loss "
            f"{r0['best_loss']:.4f}; without decay {t['no_decay_loss']:.4f} (decay gains {t['decay_gain']:+.4f} "
            f"nats; train without decay {t['no_decay_train']:.4f})" + ("  AT GRID EDGE" if t["edge"] else "")
        )
        for v, r in t["regret"].items():
            print(
                f"    {v:14s} lambda {r['lr']:.4g}  val loss {r['loss']:.4f}  regret {_fmt_regret(r)}  per seed "
                + " ".join(f"{x:+.4f}" for x in r["per_seed"].values())
            )


def _sizes(text: str) -> tuple[int, int, int, int]:
    """``'W,K,T,B'`` -> ``(width, depth, steps, batch)``."""
    sizes = tuple(int(v) for v in text.split(","))
    if len(sizes) != 4:
        raise SystemExit(f"want W,K,T,B (width, depth, steps, batch), got {text!r}")
    return sizes  # type: ignore[return-value]


def _size_overrides(args) -> dict:
    """The preset's or study's entries that ``--proxy``, ``--target``, ``--multiples``, ``--num-lrs`` and
    ``--train-examples`` replace."""
    out: dict = {}
    if args.proxy:
        w, k, t, b = _sizes(args.proxy)
        out.update(
            {"proxy": (w, k, t, b)} if args.study == "recipe" else {"width": w, "depth": k, "steps": t, "batch": b}
        )
    if args.target:
        out["targets"] = {label: _sizes(v) for label, _, v in (x.rpartition("=") for x in args.target)}
    if args.multiples:
        out["multiples"] = tuple(int(m) for m in args.multiples.split(","))
    if args.num_lrs:
        out["num_lrs"] = args.num_lrs
    if args.train_examples:
        out["train_examples"] = args.train_examples
    return out


def main(argv=None):
    p = cli.parser(__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp", choices=sorted(MODELS))
    p.add_argument("--study", default="recipe", choices=("recipe", "horizon", "batch", "wd"))
    p.add_argument("--preset", default=None, choices=("quick", "default"))
    p.add_argument("--optimizers", default=None, help="comma-separated subset of mup_adamw,muon,adamw_sp")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument(
        "--controls",
        default=None,
        choices=("off", "add", "only"),
        help="recipe study: beside each target that is wider or deeper than the proxy, the same steps and batch "
        "at the proxy's width and depth (the horizon and batch rules' regret alone); 'only': just those "
        "(default: the preset's)",
    )
    p.add_argument(
        "--proxy",
        default=None,
        metavar="W,K,T,B",
        help="the proxy's width, depth, steps and batch (overrides the preset's or the study's)",
    )
    p.add_argument(
        "--target",
        action="append",
        default=None,
        metavar="LABEL=W,K,T,B",
        help="recipe study: a target (repeat for more; replaces the preset's)",
    )
    p.add_argument("--multiples", default=None, help="studies: the targets' multiples of T0 or B0, e.g. 4,16")
    p.add_argument("--num-lrs", type=int, default=None, help="LR-grid points (overrides the preset's)")
    p.add_argument("--train-examples", type=int, default=None, help="--study wd: the proxy's training windows")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    preset = args.preset or ("quick" if args.quick else "default")
    spec = MODELS[args.model]
    cfg = dict(spec["studies"][args.study] if args.study != "recipe" else spec["presets"][preset])
    cfg.update(_size_overrides(args))
    seeds = list(range(args.seeds or cfg["seeds"]))
    L = Lab(args, seeds, cfg["num_lrs"], cfg.get("train_examples"))

    if args.study == "recipe":
        proxy = L.scale(*cfg["proxy"])
        targets = lab.transfer_controls(
            proxy, {k: L.scale(*v) for k, v in cfg["targets"].items()}, args.controls or cfg.get("controls", "off")
        )
        variants = {"full recipe": None, "no horizon": {"horizon": None}, "no batch": {"batch": None}, "naive": []}
        axis = None
    else:
        proxy = L.scale(cfg["width"], cfg["depth"], cfg["steps"], cfg["batch"])
        if args.study == "batch":
            targets = {
                f"{k} B0, equal tokens": L.scale(cfg["width"], cfg["depth"], cfg["steps"] // k, k * cfg["batch"])
                for k in cfg["multiples"]
            }
            variants, axis = {"batch rule": [st.batch()], "naive": []}, "batch_size"
        else:
            targets = {
                f"{k} T0": L.scale(cfg["width"], cfg["depth"], k * cfg["steps"], cfg["batch"]) for k in cfg["multiples"]
            }
            variants, axis = {"horizon rule": [st.horizon()], "naive": []}, "steps"

    specs = optimizers(args.model, lambda init: L.family_for(init, proxy.depth), proxy.width)
    if args.optimizers:
        specs = {k: v for k, v in specs.items() if k in args.optimizers.split(",")}
    what = f"{args.model}, {args.study}" + (f", {preset}" if args.study == "recipe" else "")
    print(f"recipe ({what}): proxy {proxy}, targets {list(targets.values())}")
    print(f"  {cfg['num_lrs']} LRs (x2), seeds {seeds}")
    t_start = time.time()
    results = {}
    for name, (init, factory) in specs.items():
        t = time.time()
        if args.study == "wd":
            res = L.weight_decay_study(name, init, proxy, targets, centers(args.model)[name])
            res["proxy_scale"] = proxy
            report_wd(name, res)
            fx = fitted_exponents(res, "steps")
            res["exponent"] = fx
            print(
                f"  fitted exponent c (lambda* ~ T^-c): seed mean {-fx['mean']:.3f}, per seed "
                + ", ".join(f"{-x:.3f}" for x in fx["per_seed"].values())
                + f"  (the rule's, with the published horizon exponent: {1 - st.HORIZON_EXPONENT:g})"
            )
        else:
            res = L.transfer_study(name, init, factory, proxy, targets, variants, centers(args.model)[name])
            res["proxy_scale"] = proxy
            report(name, res, variants)
            if axis is not None:
                fx = fitted_exponents(res, axis)
                res["exponent"] = fx
                pub = st.HORIZON_EXPONENT if axis == "steps" else -st.BATCH_EXPONENT
                print(
                    f"  fitted exponent a (eta* ~ {axis}^-a): seed mean {-fx['mean']:.3f}, per seed "
                    + ", ".join(f"{-x:.3f}" for x in fx["per_seed"].values())
                    + f"  (published {pub:g})"
                )
        results[name] = res
        print(f"  ({time.time() - t:.0f} s)", flush=True)
    elapsed = time.time() - t_start

    metric = "validation loss, grid steps of lambda" if args.study == "wd" else "train loss"
    print(f"\nsummary: regret at the target (nats; grid steps), {len(seeds)} seeds, {metric}")
    for name, res in results.items():
        for label, t in res["targets"].items():
            print(
                f"  {name:10s} {label:34s} "
                + "  ".join(f"{v}: {r['regret']:+.4f} ({r['regret_steps']:+.2f})" for v, r in t["regret"].items())
                + (f"  [decay gains {t['decay_gain']:+.4f}]" if "decay_gain" in t else "")
            )
    print(f"({elapsed:.0f} s)")
    suffix = "" if args.model == "mlp" else "_gpt"
    fig = os.path.join(args.out, f"recipe_{args.study}{suffix}.png")
    plot(results, fig, "weight decay lambda" if args.study == "wd" else "peak LR")
    print(f"figure: {fig}")
    cli.write_json(
        args.json,
        {
            "benchmark": "recipe",
            "model": args.model,
            "study": args.study,
            "preset": preset,
            "seeds": seeds,
            "results": {
                n: {
                    **{k: r[k] for k in ("proxy_lr", "proxy_best", "proxy_lambda", "exponent") if k in r},
                    "targets": {
                        k: {"scale": vars(t["scale"])}
                        | {f: t[f] for f in ("regret", "best", "curve", "decay_gain", "no_decay_loss") if f in t}
                        for k, t in r["targets"].items()
                    },
                }
                for n, r in results.items()
            },
            "seconds": elapsed,
            "environment": cli.environment(),
        },
    )
    return results


def plot(results, path, xlabel):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        for label, t in res["targets"].items():
            xs = sorted(t["curve"])
            (line,) = ax.plot(xs, [t["curve"][g] for g in xs], "-", alpha=0.6, label=label)
            for (v, r), marker in zip(t["regret"].items(), "o^sDv"):
                ax.plot(
                    r["lr"], r["loss"], marker, color=line.get_color(), mfc="none" if v == "naive" else line.get_color()
                )
            if "no_decay_loss" in t:
                ax.axhline(t["no_decay_loss"], color=line.get_color(), ls=":", lw=0.8)
        first = next(iter(res["targets"].values()))
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("target train loss")
        ax.legend(fontsize=7, title=" ".join(f"{m}={v}" for v, m in zip(first["regret"], "o^sDv")), title_fontsize=6)
    lab.savefig(fig, path)


if __name__ == "__main__":
    main()
