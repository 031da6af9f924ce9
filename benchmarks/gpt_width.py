"""GPT width transfer: one peak learning rate for a GPT-style decoder at every width?

muP's headline experiment on the package's decoder: ``spectral_optax.nn.linen.Transformer``
(pre-LN, fused QKV, GELU MLP, learned positions, untied head, ``h + (2/K) f(h)``
branches at a fixed depth K, heads of width 16 so the head count grows with
the width) on byte-level next-byte prediction over the embedded text. Every
optimizer is swept over a factor-2 grid of *peak* LRs (5% linear warm-up,
cosine decay to 0) at every width and seed:

* ``muon``, ``moga`` (p = 2), ``mup_adamw`` (base width 64), ``spectral_sgd``
  (momentum 0.9): Parametrization-1 init (``spectral_normal(gain=1)`` kernels,
  ``N(0, 1)`` embeddings);
* ``adamw_sp``: ``optax.adamw`` with Flax's default init (the standard
  parametrization), the control that must *not* transfer.

Reported per optimizer, on train loss (last 5% of steps) and validation loss
(the held-out last 10% of the text): the best LR per width (parabola-refined,
seed-averaged losses), its spread in grid steps, the fitted exponent ``s`` of
``best LR ~ width^s`` with its interval over seeds (the slopes fitted to each
seed's own best LRs: min .. max; the seed-mean slope need not lie inside it),
the loss at the best LR, and at the widest
width whether the best muP-family loss is at most SP AdamW's.

    python -m benchmarks.gpt_width [--quick | --preset quick|cpu|gpu] [--json PATH] [--out DIR]
        [--seeds K] [--optimizers muon,moga,mup_adamw,spectral_sgd,adamw_sp | all]
        [--widths 32,64,...] [--depth K] [--steps N] [--num-lrs N] [--context T]
        [--batch-size B] [--dtype bfloat16] [--no-progress] [--devices N]

Outputs in OUT: ``gpt_width_<preset>.jsonl`` (every run; rerunning resumes),
``gpt_width_<preset>_loss.png`` (loss vs peak LR, one panel per optimizer,
curves per width; train and validation rows), ``gpt_width_<preset>_best_lr.png``
(best LR vs width per optimizer: seed-averaged and per seed, fitted exponent
and its seed interval, the grey band one grid step around the median) and,
with ``--json``, the summary below plus every run.

JSON ``summary[name]`` and ``summary[name + "/val"]``: ``best_lr``,
``best_lr_grid``, ``loss_at_best``, ``spread_steps``, ``at_edge``,
``diverged`` (``lab.summarize``), ``exponent``, ``exponent_per_seed``,
``exponent_interval``, ``best_lr_per_seed``; ``widest``: the widest width's
losses at the best LR and the verdict ``mup_family_le_sp``.

Public API only.
"""

from __future__ import annotations

import os
import time

from benchmarks import _devices

_devices.early_flags()  # --devices N: before JAX starts

import numpy as np  # noqa: E402

from spectral_optax import lab  # noqa: E402
from spectral_optax.lab.cli import environment, loglog_slope, parser, preset_with_overrides, write_json  # noqa: E402

OPTIMIZERS = ("muon", "moga", "mup_adamw", "spectral_sgd", "adamw_sp")
MUP_FAMILY = ("muon", "moga", "mup_adamw", "spectral_sgd")
BASE_WIDTH = 64  # mup_adamw's base width

PRESETS = {
    # 4x width, 80 steps, 2 seeds (2026-12-01: 8.8 CPU-min; muP family 0.3-0.85 grid steps, SP AdamW 2.7).
    "quick": {"widths": (32, 64, 128), "depth": 2, "context": 32, "batch_size": 8, "steps": 80, "num_lrs": 5,
              "seeds": 2, "optimizers": OPTIMIZERS, "dtype": "float32"},
    "cpu": {"widths": (32, 64, 128, 256), "depth": 2, "context": 64, "batch_size": 8, "steps": 120, "num_lrs": 6,
            "seeds": 2, "optimizers": OPTIMIZERS, "dtype": "float32"},
    # Not measured yet (no accelerator in the session that wrote it).
    "gpu": {"widths": (64, 128, 256, 512, 1024, 2048), "depth": 4, "context": 256, "batch_size": 32,
            "steps": 2000, "num_lrs": 8, "seeds": 3, "optimizers": OPTIMIZERS, "dtype": "bfloat16"},
}

#: LR-grid centers (peak LR), factor-2 grids around them: the lab registry's for this experiment.
CENTERS = {name: lab.optimizer(name).center("gpt_width") for name in OPTIMIZERS}


def optimizer_factory(name: str, base_shapes=None, muon_options=None, moga_options=None):
    """``lr -> GradientTransformation`` (the lab registry's configuration, no weight decay) for a benchmark
    optimizer name; ``muon_options`` / ``moga_options``: extra keyword arguments of ``so.muon`` (the drift
    ablations: ``adam_learning_rate``, ``output``) / ``so.moga`` (``head_base_width``)."""
    if name not in OPTIMIZERS:
        raise SystemExit(f"unknown optimizer {name!r}; have {OPTIMIZERS}")
    options = {
        "muon": muon_options or {},
        "moga": moga_options or {},
        "mup_adamw": {"base": base_shapes, "weight_decay": 0.0},
        "adamw_sp": {"weight_decay": 0.0},
    }.get(name, {})
    opt = lab.optimizer(name)
    return lambda lr: opt(lr, **options)


def configure(args) -> tuple[str, dict]:
    preset, cfg = preset_with_overrides(args, PRESETS,
                                        ("steps", "num_lrs", "batch_size", "depth", "context", "seeds", "dtype"))
    if args.widths:
        cfg["widths"] = tuple(int(w) for w in args.widths.split(","))
    if args.optimizers:
        cfg["optimizers"] = OPTIMIZERS if args.optimizers == "all" else tuple(args.optimizers.split(","))
    unknown = [o for o in cfg["optimizers"] if o not in OPTIMIZERS]
    if unknown:
        raise SystemExit(f"unknown optimizers {unknown}; have {list(OPTIMIZERS)}")
    return preset, cfg


def widest_verdict(summary, optimizers, width) -> dict:
    """Loss at the best LR at the widest width; whether the best muP-family loss <= SP AdamW's."""
    out = {}
    for what, suffix in (("train", ""), ("val", "/val")):
        losses = {n: summary[n + suffix]["loss_at_best"].get(width, np.nan) for n in optimizers}
        fam = [v for n, v in losses.items() if n in MUP_FAMILY and np.isfinite(v)]
        sp = losses.get("adamw_sp", np.nan)
        out[what] = {"loss_at_best": losses,
                     "mup_family_le_sp": bool(fam and np.isfinite(sp) and min(fam) <= sp) if "adamw_sp" in losses
                     else None}
    return {"width": width, **out}


def table(summary, optimizers, widths, suffix="") -> str:
    rows = ["| optimizer | " + " | ".join(f"w={w}" for w in widths)
            + " | spread (steps) | exponent [per-seed min, max] | loss at best, widest |",
            "|" + "---|" * (len(widths) + 4)]
    for n in optimizers:
        s = summary[n + suffix]
        cells = [f"{s['best_lr'].get(w, np.nan):.3g}" + ("*" if w in s["at_edge"] else "") for w in widths]
        lo, hi = s["exponent_interval"]
        rows.append(f"| {n} | " + " | ".join(cells) + f" | {s['spread_steps']:.2f} | {s['exponent']:+.2f} "
                    f"[{lo:+.2f}, {hi:+.2f}] | {s['loss_at_best'].get(widths[-1], np.nan):.3f} |")
    rows.append("(best peak LR of the seed-averaged loss; * = at the edge of the grid)")
    return "\n".join(rows)


def _save(fig, path, suptitle):
    import matplotlib.pyplot as plt

    fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    lab.savefig(fig, path)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def loss_figure(results, summary, path, title):
    """Loss vs peak LR, one panel per optimizer (curves per width, stars at the best LR); train and
    validation rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(2, len(names), figsize=(3.0 * len(names) + 0.4, 5.6), squeeze=False)
    for j, name in enumerate(names):
        for i, (metric, suffix) in enumerate((("train_loss", ""), ("val_loss", "/val"))):
            s = summary[name + suffix]
            lab.plot_sweep(results[name], ax=axes[i, j], metric=metric,
                           title=f"{name} ({'val' if suffix else 'train'})\nspread {s['spread_steps']:.2f} steps, "
                                 f"s = {s['exponent']:+.2f}")
            axes[i, j].title.set_fontsize(8)
            if j:
                axes[i, j].set_ylabel("")
    return _save(fig, path, title + ": loss vs peak LR (warm-up + cosine), curves per width")


def best_lr_figure(summary, names, widths, path, title, grids=None):
    """Best peak LR vs width per optimizer: seed-averaged (thick) and per seed (thin), the fitted exponent
    with the range of the per-seed exponents, the grey band one grid step (x2) wide around the median;
    train and val rows. ``grids[name]``: the LR grid, the y range of its panels (a drift reads at a glance)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(names), figsize=(2.9 * len(names) + 0.4, 5.4), squeeze=False)
    for j, name in enumerate(names):
        for i, suffix in enumerate(("", "/val")):
            s, ax = summary[name + suffix], axes[i, j]
            best = np.array([s["best_lr"].get(w, np.nan) for w in widths], float)
            ok = np.isfinite(best)
            if ok.any():
                mid = float(np.exp(np.median(np.log(best[ok]))))
                ax.axhspan(mid / np.sqrt(2), mid * np.sqrt(2), color="0.88", zorder=0)
            for seed, per in s["best_lr_per_seed"].items():
                ax.plot(widths, [per.get(w, np.nan) for w in widths], "--", lw=0.8, marker=".", ms=3,
                        color="0.45", label=f"seed {seed}")
            ax.plot(widths, best, "-o", ms=4, lw=1.6, color="C0", label="seed mean")
            if np.isfinite(s["exponent"]) and ok.sum() >= 2:
                w = np.asarray(widths, float)[ok]
                c = np.polyfit(np.log(w), np.log(best[ok]), 1)
                ax.plot(w, np.exp(np.polyval(c, np.log(w))), ":", color="C3", lw=1.2, label="fit")
            lo, hi = s["exponent_interval"]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            if grids and name in grids:
                ax.set_ylim(min(grids[name]) / 1.2, max(grids[name]) * 1.2)
            ax.set_title(f"{name} ({'val' if suffix else 'train'}): s = {s['exponent']:+.2f} "
                         f"[{lo:+.2f}, {hi:+.2f}]\nspread {s['spread_steps']:.2f} steps", fontsize=8)
            ax.set_xlabel("width", fontsize=8)
            ax.grid(alpha=0.3, which="both", lw=0.4)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("best peak LR", fontsize=8)
    axes[0, 0].legend(fontsize=6)
    return _save(fig, path, title + ": best LR vs width (best LR ~ width^s, [per-seed min, max]; grey: one "
                 "grid step; y range: the LR grid)")


# --------------------------------------------------------------------------
# Item 3: where does a best LR drift with width? The quadratic model per route.
# --------------------------------------------------------------------------
def route_drift(data, cfg, names, seeds, warm_steps, batch_size=32, warm_lrs=None, options=()):
    """For each optimizer, width and seed: train ``warm_steps`` at a constant LR (``warm_lrs[name]``,
    default half the grid center), then the quadratic-model step ``eta*`` of the optimizer's next update
    direction, whole and per route (``lab.quadratic_steps``), on a fixed batch of ``batch_size`` training
    sequences; ``options``: :func:`optimizer_factory`'s ``muon_options, moga_options``. Returns
    ``{name: {route: {width: [eta* per seed]}}, ...}`` plus the curvature and decrease."""
    import jax
    import jax.numpy as jnp

    family = lab.gpt_family(data, vary="width", depth=cfg["depth"], init="spectral")
    base_shapes = family(BASE_WIDTH).shapes()
    out = {}
    for name in names:
        lr = (warm_lrs or {}).get(name, CENTERS[name] / 2)
        tx = optimizer_factory(name, base_shapes, *options)(1.0)  # the direction; the step is lr * it (no decay)
        res = {"warm_lr": lr, "warm_steps": warm_steps, "eta_star": {}, "curvature": {}, "decrease": {}}
        for w in cfg["widths"]:
            model = family(w)
            labels = lab.route_labels(model.shapes())

            @jax.jit
            def train(params, key, model=model):
                def step(carry, k):
                    p, st = carry
                    idx = jax.random.randint(k, (cfg["batch_size"],), 0, data.num_train)
                    x, y = data.batch(data.train, idx)
                    u, st = tx.update(jax.grad(model.loss)(p, x, y), st, p)
                    return (jax.tree_util.tree_map(lambda a, b: a + lr * b, p, u), st), None

                (p, st), _ = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(key, warm_steps))
                return p, st

            @jax.jit
            def measure(params, state, x, y, model=model, labels=labels):
                loss = lambda p: model.loss(p, x, y)  # noqa: E731
                g = jax.grad(loss)(params)
                u, _ = tx.update(g, state, params)
                return lab.quadratic_steps(loss, params, g, u, labels)

            for seed in seeds:
                key = jax.random.key(1000 + seed)
                params = model.init(jax.random.key(seed))
                params, state = train(params, key) if warm_steps else (params, tx.init(params))
                rng = np.random.default_rng(seed)
                x, y = data.numpy_batch("train", rng.integers(0, data.num_train, batch_size))
                q = jax.device_get(measure(params, state, jnp.asarray(x), jnp.asarray(y)))
                for route, v in q.items():
                    for field in ("eta_star", "curvature", "decrease"):
                        res[field].setdefault(route, {}).setdefault(w, []).append(float(v[field]))
            print(f"  {name} width {w}: eta* " + ", ".join(
                f"{r} {np.mean(res['eta_star'][r][w]):.3g}" for r in ("all", *lab.ROUTES)), flush=True)
        widths = list(cfg["widths"])
        res["exponent"] = {}
        for route, by_w in res["eta_star"].items():
            mean = [float(np.mean(by_w[w])) for w in widths]
            per_seed = [loglog_slope(widths, [by_w[w][i] for w in widths]) for i in range(len(seeds))]
            fin = [x for x in per_seed if np.isfinite(x)]
            res["exponent"][route] = {"mean": loglog_slope(widths, mean), "per_seed": per_seed,
                                      "interval": [min(fin), max(fin)] if fin else [np.nan, np.nan]}
        out[name] = res
    return out


def _signed(x) -> str:
    return "nan" if x is None or not np.isfinite(x) else f"{x:+.2f}"


def drift_figure(drift, widths, path, title):
    """eta* (quadratic-model step) vs width per route, one panel per optimizer (seed mean; shaded: the
    per-seed range where both ends are positive; a non-positive mean, i.e. no descent along that route on
    average, is left out). ``drift``: :func:`route_drift`'s result or its JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(drift)
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names) + 0.4, 3.2), squeeze=False)
    for j, name in enumerate(names):
        ax = axes[0, j]
        for k, route in enumerate(("all", *lab.ROUTES)):
            by_w = drift[name]["eta_star"].get(route)
            if not by_w:
                continue
            vals = [np.asarray(by_w[w] if w in by_w else by_w[str(w)], float) for w in widths]  # JSON: str keys
            mean = [float(np.mean(v)) if np.mean(v) > 0 else np.nan for v in vals]
            e = drift[name]["exponent"][route]
            ax.plot(widths, mean, "-o", ms=3, lw=1.8 if route == "all" else 1.0, color=f"C{k}",
                    label=f"{route}: s = {_signed(e['mean'])} [{_signed(e['interval'][0])}, "
                          f"{_signed(e['interval'][1])}]")
            lo = np.array([float(np.min(v)) for v in vals])
            hi = np.array([float(np.max(v)) for v in vals])
            ax.fill_between(widths, lo, hi, where=lo > 0, color=f"C{k}", alpha=0.15, lw=0)  # per-seed range
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width", fontsize=8)
        ax.set_ylabel("eta* = -g.u / u^T H u", fontsize=8)
        ax.set_title(f"{name}: step {drift[name]['warm_steps']} (LR {drift[name]['warm_lr']:.3g})", fontsize=8)
        ax.grid(alpha=0.3, which="both", lw=0.4)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    return _save(fig, path, title + ": quadratic-model step along each route of the update")


def build_parser():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="size preset (default cpu)")
    p.add_argument("--seeds", type=int, default=None, help="seeds (overrides the preset)")
    p.add_argument("--optimizers", default=None, help=f"comma-separated subset of {','.join(OPTIMIZERS)}, or all")
    p.add_argument("--widths", default=None, help="comma-separated widths (overrides the preset)")
    p.add_argument("--depth", type=int, default=None, help="blocks K (overrides the preset)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--num-lrs", type=int, default=None)
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--diagnose", action="store_true",
                   help="instead of the sweep: the quadratic-model step per route vs width (item 3 of issue 21)")
    p.add_argument("--warm-steps", type=int, default=40, help="--diagnose: steps trained before measuring")
    p.add_argument("--muon-adam-lr", type=float, default=None,
                   help="ablation: Muon's AdamW route (embeddings, vectors) at this fixed LR instead of Muon's")
    p.add_argument("--muon-head", choices=("muon", "adamw"), default="muon",
                   help="ablation: route of Muon's output head (default muon)")
    p.add_argument("--moga-head-base", type=float, default=None, metavar="W",
                   help="MOGA's width-consistent head (so.moga(head_base_width=W)) instead of the published one")
    _devices.add_arguments(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    preset, cfg = configure(args)
    devices = _devices.setup(args)
    import jax.numpy as jnp

    data = lab.load("text", context=cfg["context"], sequence=True)
    dtype = jnp.bfloat16 if cfg["dtype"] == "bfloat16" else None
    widths, names = list(cfg["widths"]), list(cfg["optimizers"])

    def family(init):
        return lab.gpt_family(data, vary="width", depth=cfg["depth"], init=init, dtype=dtype)

    muon_options = {}
    if args.muon_adam_lr is not None:
        muon_options["adam_learning_rate"] = args.muon_adam_lr
    if args.muon_head != "muon":
        muon_options["output"] = args.muon_head
    moga_options = {} if args.moga_head_base is None else {"head_base_width": args.moga_head_base}
    if args.diagnose:
        return diagnose(args, preset, cfg, data, names, muon_options, moga_options)
    base_shapes = family("spectral")(BASE_WIDTH).shapes()
    tag = f"gpt-K{cfg['depth']}-T{cfg['context']}-{cfg['dtype']}"
    muon_tag, moga_tag = ("".join(f"-{k}={v}" for k, v in sorted(o.items())) for o in (muon_options, moga_options))
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, f"gpt_width_{preset}.jsonl")
    print(f"gpt width transfer ({preset}): widths {widths}, depth {cfg['depth']}, context {cfg['context']}, "
          f"batch {cfg['batch_size']}, {cfg['steps']} steps, {cfg['num_lrs']} LRs, seeds {cfg['seeds']}, "
          f"{cfg['dtype']}, backend {environment()['backend']}", flush=True)
    if preset == "quick":
        print("--quick is a smoke run: 4x width (32..128) at 80 steps, 2 seeds, about 9 CPU-minutes on 2 cores. "
              "Its verdicts matched the cpu preset's for muon, moga, mup_adamw and adamw_sp but not for spectral_sgd "
              "(0.61 against 0.22 grid steps, 2026-12-01), so its spreads do not measure transfer; the measurement "
              "(8x width) is `python -m benchmarks.gpt_width --preset cpu` (docs/benchmarks.md)", flush=True)
    t0 = time.time()
    results, summary = {}, {}
    for name in names:
        res = lab.sweep(
            family("standard" if name == "adamw_sp" else "spectral"),
            optimizer_factory(name, base_shapes, muon_options, moga_options),
            sizes=widths, lrs=lab.lr_grid(CENTERS[name], cfg["num_lrs"]), data=data, steps=cfg["steps"],
            batch_size=cfg["batch_size"], seeds=list(range(cfg["seeds"])), results=results_path, name=name,
            tag=tag + {"muon": muon_tag, "moga": moga_tag}.get(name, ""), size_name="width",
            progress=not args.no_progress,
            schedule="warmup_cosine", eval_examples=256, devices=devices,
        )
        results[name] = res
        both = lab.exponent_summaries(res.runs, widths)
        summary[name], summary[f"{name}/val"] = both["train"], both["val"]
        for key in (name, f"{name}/val"):
            s = summary[key]
            lo, hi = s["exponent_interval"]
            best = ", ".join(f"{w}: {s['best_lr'][w]:.3g}" for w in widths)
            print(f"[{time.time() - t0:6.0f}s] {key:18s} spread {s['spread_steps']:.2f} steps, exponent "
                  f"{s['exponent']:+.2f} [{lo:+.2f}, {hi:+.2f}]; best LR {best}; at edge {s['at_edge']}; "
                  f"diverged {s['diverged']}", flush=True)
    if not _devices.is_writer():  # multi-host: process 0 writes figures and the JSON
        return summary
    widest = widest_verdict(summary, names, widths[-1])
    tables = {"train": table(summary, names, widths), "val": table(summary, names, widths, "/val")}
    print("train loss:\n" + tables["train"] + "\nvalidation loss:\n" + tables["val"])
    print(f"widest width {widths[-1]}: best muP-family loss <= SP AdamW's: train "
          f"{widest['train']['mup_family_le_sp']}, val {widest['val']['mup_family_le_sp']}")
    title = f"GPT width (depth {cfg['depth']}, context {cfg['context']}, {cfg['steps']} steps, {cfg['seeds']} seeds)"
    figures = [loss_figure(results, summary, os.path.join(args.out, f"gpt_width_{preset}_loss.png"), title),
               best_lr_figure(summary, names, widths, os.path.join(args.out, f"gpt_width_{preset}_best_lr.png"),
                              title, grids={n: lab.lr_grid(CENTERS[n], cfg["num_lrs"]) for n in names})]
    payload = {
        "benchmark": "gpt_width", "preset": preset,
        "config": dict(cfg, data=data.name, schedule="warmup_cosine", base_blocks=2, head_dim=16,
                       muon_options=muon_options, moga_options=moga_options,
                       mup_base_width=BASE_WIDTH, lr_centers={k: CENTERS[k] for k in names}),
        "summary": summary, "widest": widest, "tables": tables, "figures": figures,
        "runs": [r for res in results.values() for r in res.runs],
        "wall_s": time.time() - t0, "environment": environment(),
    }
    write_json(args.json, payload)
    return payload


def diagnose(args, preset, cfg, data, names, muon_options=None, moga_options=None):
    """``--diagnose``: :func:`route_drift` for the chosen optimizers (default muon, moga), figure and JSON."""
    t0 = time.time()
    names = [n for n in names if n != "adamw_sp"] if args.optimizers else ["muon", "moga"]
    os.makedirs(args.out, exist_ok=True)
    drift = route_drift(data, cfg, names, list(range(cfg["seeds"])), args.warm_steps,
                        options=(muon_options, moga_options))
    title = f"GPT width (depth {cfg['depth']}, context {cfg['context']}, {cfg['seeds']} seeds)"
    fig = drift_figure(drift, list(cfg["widths"]),
                       os.path.join(args.out, f"gpt_width_{preset}_drift_step{args.warm_steps}.png"), title)
    for name, res in drift.items():
        print(f"{name} (after {args.warm_steps} steps at LR {res['warm_lr']:.3g}): exponent of eta* vs width: "
              + ", ".join(f"{r} {e['mean']:+.2f} [{e['interval'][0]:+.2f}, {e['interval'][1]:+.2f}]"
                          for r, e in res["exponent"].items()))
    config = dict(cfg, data=data.name, muon_options=muon_options, moga_options=moga_options)
    payload = {"benchmark": "gpt_width", "mode": "diagnose", "preset": preset, "config": config,
               "drift": drift, "figure": fig, "wall_s": time.time() - t0, "environment": environment()}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
