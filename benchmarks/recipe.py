"""Tune once, train bigger, longer and at a larger batch: the transfer recipe, judged by regret.

Tune the peak LR on a proxy (the quickstart's byte-level MLP: width 64,
``T0`` steps, batch ``B0``), transfer it with :mod:`spectral_optax.transfer`
to a target (wider, longer, larger batch) and train the target over its own
LR grid, centred on the transferred LR. Printed per optimizer: the account
of the factors, and the target's **regret** (:func:`spectral_optax.lab.regret`:
its loss at the transferred LR minus the best loss of its own sweep, in nats
and in grid steps) for the full recipe, with each rule switched off in turn,
and for the naive transfer (the proxy's LR unchanged). Width is transferred
by the parametrization (``mup_adamw``, ``muon``); SP AdamW (``optax.adamw``,
Flax init) is the control. The MLP has one hidden layer, so depth is not
varied here.

``--study horizon``: the horizon rule alone. The proxy at ``T0``, targets at
``4 T0`` and ``16 T0`` (same width and batch); per seed, the best LR at each
horizon and the fitted exponent ``a`` in ``eta* ~ T^-a`` next to the
published 0.32; the regret of the rule and of the naive transfer.
``--study batch``: the batch rule alone, ``B0 -> 4 B0, 16 B0`` at equal tokens
(fewer steps) and at equal steps (the horizon rule then applies too).

    python -m benchmarks.recipe [--quick] [--study recipe|horizon|batch] [--seeds K]
        [--optimizers a,b] [--json PATH] [--out DIR]

Runs are appended to ``OUT/recipe.jsonl`` (an interrupted run resumes).
Weight decay stays at the optimizers' defaults here (``1e-4`` for the AdamW
routes: a timescale ``1 / (eta lambda)`` far longer than these runs), so the
weight-decay rule is printed but not measured.
"""

from __future__ import annotations

import os
import time

import jax.numpy as jnp
import numpy as np
import optax

import spectral_optax as so
from benchmarks import _common
from benchmarks.width_transfer import MUP_EMBEDDING_LR_SCALE
from spectral_optax import lab
from spectral_optax import transfer as st

PRESETS = {
    # proxy and target: width, steps, batch; LR-grid points (x2); seeds
    "quick": {"proxy": (64, 150, 32), "target": (256, 600, 64), "num_lrs": 7, "seeds": 2},
    "default": {"proxy": (64, 150, 32), "target": (512, 1200, 128), "num_lrs": 7, "seeds": 2},
}
STUDIES = {
    "horizon": {"width": 128, "steps": 150, "batch": 32, "multiples": (4, 16), "num_lrs": 7, "seeds": 2},
    "batch": {"width": 128, "steps": 600, "batch": 8, "multiples": (4, 16), "num_lrs": 7, "seeds": 2},
}
#: Proxy grid centres (best LRs of the quickstart at width 64, 150 steps, batch 32).
CENTERS = {"mup_adamw": 0.008, "muon": 0.03, "adamw_sp": 6e-3}


def optimizers(family_for, base_width):
    """name -> (init, factory(lr, width))."""
    base = family_for("spectral")(base_width).shapes()

    def mup_adamw(lr, n):
        return optax.chain(so.mup_adamw(lr, base=base), so.route_lr_scale(embedding=MUP_EMBEDDING_LR_SCALE))

    return {
        "mup_adamw": ("spectral", mup_adamw),
        "muon": ("spectral", lambda lr, n: so.muon(lr, compute_dtype=jnp.float32)),
        "adamw_sp": ("standard", lambda lr, n: optax.adamw(lr, weight_decay=1e-4)),
    }


def _grid_around(lr, num):
    return lab.lr_grid(lr, num)


def per_seed_best(runs, grid):
    """seed -> refined best LR over ``grid`` (train loss)."""
    out = {}
    for seed in sorted({r["seed"] for r in runs}):
        rs = [r for r in runs if r["seed"] == seed and any(abs(r["lr"] - g) <= 1e-6 * g for g in grid)]
        out[seed] = lab.summarize(rs)["best_lr"][rs[0]["size"]]
    return out


class Lab:
    def __init__(self, args, seeds, num_lrs):
        self.data = lab.load("text", context=8, flatten=True)
        self.seeds, self.num_lrs, self.progress = seeds, num_lrs, not args.no_progress
        self.results = os.path.join(args.out, "recipe.jsonl")

    def family_for(self, init):
        return lab.mlp_family(self.data, vary="width", depth=1, init=init)

    def sweep(self, name, init, factory, width, lrs, steps, batch):
        with jax_highest():
            res = lab.sweep(
                self.family_for(init),
                factory,
                [width],
                lrs,
                self.data,
                steps=steps,
                batch_size=batch,
                seeds=self.seeds,
                results=self.results,
                name=name,
                tag="recipe",
                size_name="width",
                progress=self.progress,
            )
        return res.runs

    def transfer_study(self, name, init, factory, proxy, targets, variants, center):
        """Tune on ``proxy``, evaluate every variant's LR at each target.

        Returns ``{'proxy_lr', 'proxy_best': {seed: lr}, 'targets': {label: {...}}}``."""
        grid0 = lab.lr_grid(center, self.num_lrs)
        runs0 = self.sweep(name, init, factory, proxy.width, grid0, proxy.steps, proxy.batch_size)
        s0 = lab.summarize(runs0)
        lr0 = s0["best_lr"][proxy.width]
        out = {"proxy_lr": lr0, "proxy_best": per_seed_best(runs0, grid0), "proxy_edge": bool(s0["at_edge"])}
        out["targets"] = {}
        for label, target in targets.items():
            ts = {v: st.transfer({"learning_rate": lr0}, proxy, target, rules=r) for v, r in variants.items()}
            first = next(iter(ts))
            grid = _grid_around(ts[first]["learning_rate"], self.num_lrs)
            extra = [
                t["learning_rate"] for t in ts.values() if all(abs(t["learning_rate"] - g) > 1e-6 * g for g in grid)
            ]
            runs = self.sweep(name, init, factory, target.width, grid + extra, target.steps, target.batch_size)
            reg = {v: lab.regret(runs, t["learning_rate"], grid=grid, reference="all") for v, t in ts.items()}
            out["targets"][label] = {
                "scale": target,
                "transfer": ts,
                "regret": reg,
                "best": per_seed_best(runs, grid),
                "edge": lab.summarize([r for r in runs if any(abs(r["lr"] - g) <= 1e-6 * g for g in grid)])["at_edge"],
                "curve": {
                    g: float(
                        np.mean(
                            [
                                r["train_loss"] if r["train_loss"] is not None else np.inf
                                for r in runs
                                if abs(r["lr"] - g) <= 1e-6 * g
                            ]
                        )
                    )
                    for g in sorted(grid + extra)
                },
            }
        return out


def jax_highest():
    import jax

    return jax.default_matmul_precision("highest")


def _fmt_regret(r):
    return f"{r['regret']:+.4f} nats {r['regret_steps']:+.2f} st" + (" (interp.)" if r["interpolated"] else "")


def fitted_exponents(res, axis):
    """Per seed (and for the seed mean): ``-slope`` of log best LR vs log(axis value)."""
    xs = [getattr(res["proxy_scale"], axis)] + [getattr(t["scale"], axis) for t in res["targets"].values()]
    seeds = sorted(res["proxy_best"])
    per_seed = {}
    for s in seeds:
        ys = [res["proxy_best"][s]] + [t["best"][s] for t in res["targets"].values()]
        per_seed[s] = _common.loglog_slope(xs, ys)
    mean = [res["proxy_lr"]] + [t["regret"][next(iter(t["regret"]))]["best_lr"] for t in res["targets"].values()]
    return {"per_seed": per_seed, "mean": _common.loglog_slope(xs, mean)}


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


def main(argv=None):
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--study", default="recipe", choices=("recipe", "horizon", "batch"))
    p.add_argument("--preset", default=None, choices=sorted(PRESETS))
    p.add_argument("--optimizers", default=None, help="comma-separated subset of mup_adamw,muon,adamw_sp")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    preset = args.preset or ("quick" if args.quick else "default")
    cfg = STUDIES[args.study] if args.study != "recipe" else PRESETS[preset]
    seeds = list(range(args.seeds or cfg["seeds"]))
    L = Lab(args, seeds, cfg["num_lrs"])

    if args.study == "recipe":
        (w0, t0, b0), (w1, t1, b1) = cfg["proxy"], cfg["target"]
        proxy, targets = (
            st.Scale(width=w0, steps=t0, batch_size=b0),
            {"target": st.Scale(width=w1, steps=t1, batch_size=b1)},
        )
        variants = {"full recipe": None, "no horizon": {"horizon": None}, "no batch": {"batch": None}, "naive": []}
        axis = None
    elif args.study == "horizon":
        proxy = st.Scale(width=cfg["width"], steps=cfg["steps"], batch_size=cfg["batch"])
        targets = {
            f"{k} T0": st.Scale(width=cfg["width"], steps=k * cfg["steps"], batch_size=cfg["batch"])
            for k in cfg["multiples"]
        }
        variants = {"horizon rule": [st.horizon()], "naive": []}
        axis = "steps"
    else:
        proxy = st.Scale(width=cfg["width"], steps=cfg["steps"], batch_size=cfg["batch"])
        targets = {}
        for k in cfg["multiples"]:
            targets[f"{k} B0, equal tokens"] = st.Scale(
                width=cfg["width"], steps=cfg["steps"] // k, batch_size=k * cfg["batch"]
            )
        variants = {"batch rule": [st.batch()], "naive": []}
        axis = "batch_size"

    specs = optimizers(L.family_for, proxy.width)
    if args.optimizers:
        specs = {k: v for k, v in specs.items() if k in args.optimizers.split(",")}
    what = args.study + (f", {preset}" if args.study == "recipe" else "")
    print(f"recipe ({what}): proxy {proxy}, targets {list(targets.values())}")
    print(f"  {cfg['num_lrs']} LRs (x2), seeds {seeds}")
    t_start = time.time()
    results = {}
    for name, (init, factory) in specs.items():
        t = time.time()
        res = L.transfer_study(name, init, factory, proxy, targets, variants, CENTERS[name])
        res["proxy_scale"] = proxy
        results[name] = res
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
        print(f"  ({time.time() - t:.0f} s)", flush=True)
    elapsed = time.time() - t_start

    print(f"\nsummary: regret at the target (nats; grid steps), {len(seeds)} seeds, train loss")
    for name, res in results.items():
        for label, t in res["targets"].items():
            print(
                f"  {name:10s} {label:22s} "
                + "  ".join(
                    f"{v}: {t['regret'][v]['regret']:+.4f} ({t['regret'][v]['regret_steps']:+.2f})" for v in variants
                )
            )
    print(f"({elapsed:.0f} s)")
    fig = os.path.join(args.out, f"recipe_{args.study}.png")
    plot(results, variants, fig)
    print(f"figure: {fig}")
    _common.write_json(
        args.json,
        {
            "benchmark": "recipe",
            "study": args.study,
            "preset": preset,
            "seeds": seeds,
            "results": {
                n: {
                    "proxy_lr": r["proxy_lr"],
                    "proxy_best": r["proxy_best"],
                    "exponent": r.get("exponent"),
                    "targets": {
                        k: {"scale": vars(t["scale"]), "regret": t["regret"], "best": t["best"], "curve": t["curve"]}
                        for k, t in r["targets"].items()
                    },
                }
                for n, r in results.items()
            },
            "seconds": elapsed,
            "environment": _common.environment(),
        },
    )
    return results


def plot(results, variants, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        for label, t in res["targets"].items():
            lrs = sorted(t["curve"])
            (line,) = ax.plot(lrs, [t["curve"][g] for g in lrs], "-", alpha=0.6, label=label)
            for v, marker in zip(variants, "o^sDv"):
                r = t["regret"][v]
                ax.plot(
                    r["lr"], r["loss"], marker, color=line.get_color(), mfc="none" if v == "naive" else line.get_color()
                )
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("peak LR")
        ax.set_ylabel("target train loss")
        ax.legend(fontsize=7, title=" ".join(f"{m}={v}" for v, m in zip(variants, "o^sDv")), title_fontsize=6)
    lab.savefig(fig, path)


if __name__ == "__main__":
    main()
