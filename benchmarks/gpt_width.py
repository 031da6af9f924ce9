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
``best LR ~ width^s`` with its interval over seeds (the slope fitted to each
seed's own best LRs: min .. max), the loss at the best LR, and at the widest
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
import optax  # noqa: E402

import spectral_optax as so  # noqa: E402
from benchmarks._common import environment, loglog_slope, parser, write_json  # noqa: E402
from spectral_optax import lab  # noqa: E402

OPTIMIZERS = ("muon", "moga", "mup_adamw", "spectral_sgd", "adamw_sp")
MUP_FAMILY = ("muon", "moga", "mup_adamw", "spectral_sgd")
BASE_WIDTH = 64  # mup_adamw's base width

PRESETS = {
    # A smoke run of the machinery (2 seeds, 4x width): see the cpu preset for the measurement.
    "quick": {"widths": (32, 64, 128), "depth": 2, "context": 32, "batch_size": 8, "steps": 80, "num_lrs": 5,
              "seeds": 2, "optimizers": OPTIMIZERS, "dtype": "float32"},
    "cpu": {"widths": (32, 64, 128, 256), "depth": 2, "context": 64, "batch_size": 8, "steps": 120, "num_lrs": 6,
            "seeds": 2, "optimizers": OPTIMIZERS, "dtype": "float32"},
    # Not measured yet (no accelerator in the session that wrote it).
    "gpu": {"widths": (64, 128, 256, 512, 1024, 2048), "depth": 4, "context": 256, "batch_size": 32,
            "steps": 2000, "num_lrs": 8, "seeds": 3, "optimizers": OPTIMIZERS, "dtype": "bfloat16"},
}

#: LR-grid centers (peak LR), factor-2 grids around them. (Starting points: gpt_depth's cpu preset at width
#: 32, 120 steps, P1 init: Muon ~0.06, MOGA p = 2 ~0.01, AdamW ~0.02; SP AdamW's best LR falls with width.)
CENTERS = {"muon": 6.4e-2, "moga": 1.6e-2, "mup_adamw": 1.6e-2, "spectral_sgd": 6.4e-2, "adamw_sp": 8e-3}


def optimizer_factory(name: str, base_shapes=None):
    """``lr -> GradientTransformation`` (defaults, no weight decay) for a benchmark optimizer name."""
    if name == "muon":
        return lambda lr: so.muon(lr)
    if name == "moga":
        return lambda lr: so.moga(lr, p=2.0)
    if name == "mup_adamw":
        return lambda lr: so.mup_adamw(lr, base=base_shapes, weight_decay=0.0)
    if name == "spectral_sgd":
        return lambda lr: so.spectral_sgd(lr, momentum=0.9)
    if name == "adamw_sp":
        return lambda lr: optax.adamw(lr, weight_decay=0.0)
    raise SystemExit(f"unknown optimizer {name!r}; have {OPTIMIZERS}")


def configure(args) -> tuple[str, dict]:
    preset = "quick" if args.quick else (args.preset or "cpu")
    cfg = dict(PRESETS[preset])
    for key in ("steps", "num_lrs", "batch_size", "depth", "context", "seeds", "dtype"):
        if getattr(args, key, None) is not None:
            cfg[key] = getattr(args, key)
    if args.widths:
        cfg["widths"] = tuple(int(w) for w in args.widths.split(","))
    if args.optimizers:
        cfg["optimizers"] = OPTIMIZERS if args.optimizers == "all" else tuple(args.optimizers.split(","))
    unknown = [o for o in cfg["optimizers"] if o not in OPTIMIZERS]
    if unknown:
        raise SystemExit(f"unknown optimizers {unknown}; have {list(OPTIMIZERS)}")
    return preset, cfg


def analyse(runs, widths) -> dict:
    """``lab.summarize`` of the seed-averaged losses plus the width exponent and its seed interval,
    for train (``'train'``) and validation (``'val'``) loss."""
    out = {}
    seeds = sorted({r["seed"] for r in runs})
    for what, metric in (("train", "train_loss"), ("val", "val_loss")):
        s = lab.summarize(runs, metric=metric)
        best = [s["best_lr"].get(w, np.nan) for w in widths]
        per_seed = {}
        for seed in seeds:
            ss = lab.summarize([r for r in runs if r["seed"] == seed], metric=metric)
            per_seed[seed] = {w: ss["best_lr"].get(w, np.nan) for w in widths}
        slopes = [loglog_slope(widths, [per_seed[sd][w] for w in widths]) for sd in seeds]
        finite = [x for x in slopes if np.isfinite(x)]
        s.update(
            exponent=loglog_slope(widths, best),
            exponent_per_seed=dict(zip(seeds, slopes)),
            exponent_interval=[min(finite), max(finite)] if finite else [np.nan, np.nan],
            best_lr_per_seed=per_seed,
        )
        out[what] = s
    return out


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
            + " | spread (steps) | exponent [seed interval] | loss at best, widest |",
            "|" + "---|" * (len(widths) + 4)]
    for n in optimizers:
        s = summary[n + suffix]
        cells = [f"{s['best_lr'].get(w, np.nan):.3g}" + ("*" if w in s["at_edge"] else "") for w in widths]
        lo, hi = s["exponent_interval"]
        rows.append(f"| {n} | " + " | ".join(cells) + f" | {s['spread_steps']:.2f} | {s['exponent']:+.2f} "
                    f"[{lo:+.2f}, {hi:+.2f}] | {s['loss_at_best'].get(widths[-1], np.nan):.3f} |")
    rows.append("(best peak LR of the seed-averaged loss; * = at the edge of the grid)")
    return "\n".join(rows)


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
    fig.suptitle(title + ": loss vs peak LR (warm-up + cosine), curves per width", fontsize=9)
    fig.tight_layout()
    lab.savefig(fig, path)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def best_lr_figure(summary, names, widths, path, title):
    """Best peak LR vs width per optimizer: seed-averaged (thick) and per seed (thin), the fitted exponent
    with its seed interval, the grey band one grid step (x2) wide around the median; train and val rows."""
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
            ax.set_title(f"{name} ({'val' if suffix else 'train'}): s = {s['exponent']:+.2f} "
                         f"[{lo:+.2f}, {hi:+.2f}]\nspread {s['spread_steps']:.2f} steps", fontsize=8)
            ax.set_xlabel("width", fontsize=8)
            ax.grid(alpha=0.3, which="both", lw=0.4)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("best peak LR", fontsize=8)
    axes[0, 0].legend(fontsize=6)
    fig.suptitle(title + ": best LR vs width (best LR ~ width^s; grey: one grid step)", fontsize=9)
    fig.tight_layout()
    lab.savefig(fig, path)
    plt.close(fig)
    print(f"wrote {path}")
    return path


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

    base_shapes = family("spectral")(BASE_WIDTH).shapes()
    tag = f"gpt-K{cfg['depth']}-T{cfg['context']}-{cfg['dtype']}"
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, f"gpt_width_{preset}.jsonl")
    print(f"gpt width transfer ({preset}): widths {widths}, depth {cfg['depth']}, context {cfg['context']}, "
          f"batch {cfg['batch_size']}, {cfg['steps']} steps, {cfg['num_lrs']} LRs, seeds {cfg['seeds']}, "
          f"{cfg['dtype']}, backend {environment()['backend']}", flush=True)
    t0 = time.time()
    results, summary = {}, {}
    for name in names:
        res = lab.sweep(
            family("standard" if name == "adamw_sp" else "spectral"), optimizer_factory(name, base_shapes),
            sizes=widths, lrs=lab.lr_grid(CENTERS[name], cfg["num_lrs"]), data=data, steps=cfg["steps"],
            batch_size=cfg["batch_size"], seeds=list(range(cfg["seeds"])), results=results_path, name=name,
            tag=tag, size_name="width", progress=not args.no_progress, schedule="warmup_cosine",
            eval_examples=256, devices=devices,
        )
        results[name] = res
        both = analyse(res.runs, widths)
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
                              title)]
    payload = {
        "benchmark": "gpt_width", "preset": preset,
        "config": dict(cfg, data=data.name, schedule="warmup_cosine", base_blocks=2, head_dim=16,
                       mup_base_width=BASE_WIDTH, lr_centers={k: CENTERS[k] for k in names}),
        "summary": summary, "widest": widest, "tables": tables, "figures": figures,
        "runs": [r for res in results.values() for r in res.runs],
        "wall_s": time.time() - t0, "environment": environment(),
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
