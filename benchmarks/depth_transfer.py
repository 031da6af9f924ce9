"""Depth transfer: does the best learning rate stay put as a residual MLP gets deeper?

Residual MLPs ``h_{k+1} = h_k + alpha * f_k(h_k)`` (``f_k`` = Dense -> ReLU ->
Dense at fixed width, input/output projections outside the stack;
``spectral_optax.nn.linen.ResidualMLP``) at depths K, trained over an LR grid
with each optimizer twice: with ``alpha = 2 / K`` (inverse-depth scaling) and
with ``alpha = 1`` (unscaled). The best LR per depth and its spread in grid
steps come from ``spectral_optax.lab`` (vmapped sweeps, resumable JSONL).

    python -m benchmarks.depth_transfer [--quick | --preset default|quick|gpu] [--json PATH]
        [--out DIR] [--data text|digits|cifar10:DIR] [--optimizers adamw,muon,moga1.5,moga2,moga2.5]
        [--dtype float32|bfloat16]

Numerics are the same on every backend (``--dtype float32``, the default:
float32 matmuls at ``Precision.HIGHEST`` and a float32 Newton-Schulz
iteration; ``--dtype bfloat16``: bfloat16 layers and iteration, float32
parameters). ``--preset gpu``: width 128, batch 128, 300 steps, 3 seeds,
sized for one GPU.

Default task: the lab's byte-level next-byte prediction on the embedded pydoc
text (context 8). Figures: ``OUT/depth_<optimizer>.png``, the unscaled and
the scaled sweep side by side (loss vs LR, one curve per depth).

Public API only.
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks import _devices

_devices.early_flags()  # --devices N: before JAX starts

import numpy as np  # noqa: E402

from spectral_optax import lab  # noqa: E402
from spectral_optax.lab import cli  # noqa: E402
from spectral_optax.nn.linen import ResidualMLP  # noqa: E402

#: The registry's optimizers of the depth studies, most important first (their ``depth_mlp`` LR-grid centres).
OPTIMIZERS = ("muon", "moga2", "adamw", "moga1.5", "moga2.5")


def _optimizers(ns_dtype=None):
    """name -> (factory lr -> GradientTransformation, LR-grid center): the lab registry's configurations (each
    optimizer's defaults, no weight decay); ``ns_dtype``: Muon's Newton-Schulz compute dtype."""
    opts = {}
    for name in OPTIMIZERS:
        opt = lab.optimizer(name)
        kw = {"compute_dtype": ns_dtype} if name == "muon" else {}
        opts[name] = (lambda lr, opt=opt, kw=kw: opt(lr, **kw), opt.center("depth_mlp"))
    return opts


PRESETS = {
    # depths, LR-grid points, steps, batch, width
    "default": {"depths": (2, 4, 8, 16, 32, 64), "num_lrs": 10, "steps": 200, "batch_size": 64, "width": 64},
    "quick": {"depths": (2, 8, 32), "num_lrs": 6, "steps": 100, "batch_size": 64, "width": 64},
    "gpu": {"depths": (2, 4, 8, 16, 32, 64), "num_lrs": 10, "steps": 300, "batch_size": 128, "width": 128, "seeds": 3},
}


def family(data, width: int, scaled: bool, dtype=None):
    example_x, _ = data.numpy_batch("train", [0])
    vocab = 256 if data.kind == "bytes" else None

    def make(depth: int):
        module = ResidualMLP(
            features=width,
            num_blocks=depth,
            out_features=data.num_outputs,
            alpha=None if scaled else 1.0,
            vocab_size=vocab,
            dtype=dtype,
        )
        return lab.Model.from_linen(module, example_x, "xent")

    return make


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small preset (< 3 minutes on 2 CPU cores)")
    p.add_argument("--json", default=None, help="write the results as JSON to this path")
    p.add_argument("--out", default="out", help="directory for figures and the results JSONL")
    p.add_argument("--data", default="text", help="lab data spec: text | digits | cifar10:DIR")
    p.add_argument("--optimizers", default=None, help="comma-separated subset of adamw,muon,moga1.5,moga2,moga2.5")
    p.add_argument("--depths", default=None, help="comma-separated depths (overrides the preset)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seeds", type=int, default=None, help="seeds (default: 1; 3 in the gpu preset)")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="sizes (--quick = --preset quick)")
    cli.add_dtype_argument(p)
    _devices.add_arguments(p)
    args = p.parse_args(argv)
    devices = _devices.setup(args)

    preset = args.preset or ("quick" if args.quick else "default")
    cfg = dict(PRESETS[preset])
    preset_seeds = cfg.pop("seeds", 1)
    seeds = args.seeds or preset_seeds
    if args.depths:
        cfg["depths"] = tuple(int(d) for d in args.depths.split(","))
    if args.steps:
        cfg["steps"] = args.steps
    model_dtype, ns_dtype, numerics = cli.lab_numerics(args.dtype)
    opts = _optimizers(ns_dtype)
    if args.optimizers:
        wanted = args.optimizers.split(",")
        missing = [w for w in wanted if w not in opts]
        if missing:
            raise SystemExit(f"unknown or unavailable optimizers {missing}; have {list(opts)}")
        opts = {k: opts[k] for k in wanted}
    elif preset == "quick":
        opts = {k: v for k, v in opts.items() if k in ("muon", "moga2")}

    data = lab.load(args.data, context=8)
    os.makedirs(args.out, exist_ok=True)
    suffix = "_bf16" if args.dtype == "bfloat16" else ""
    results_path = os.path.join(args.out, f"depth_transfer_{preset}{suffix}.jsonl")
    t0 = time.time()
    results, summary = {}, {}
    sweep_args = dict(data=data, cfg=cfg, seeds=seeds, results_path=results_path, devices=devices)
    for name, (factory, center) in opts.items():
        grid = lab.lr_grid(center, cfg["num_lrs"])
        for form in ("unscaled", "scaled"):
            key = f"{name}/{form}"
            make = family(data, cfg["width"], scaled=form == "scaled", dtype=model_dtype)
            with numerics():  # traced and run at the chosen precision
                res = lab.depth.depth_sweep(make, factory, grid, name=key, **sweep_args)
            results[key] = res
            s = res.summary()
            summary[key] = s
            best = ", ".join(f"K={k}: {v:.3g}" for k, v in s["best_lr"].items())
            print(
                f"[{time.time() - t0:6.0f}s] {key:18s} spread {s['spread_steps']:.2f} steps; "
                f"best LR {best}; at edge {s['at_edge']}; diverged {s['diverged']}",
                flush=True,
            )
        if _devices.is_writer():  # multi-host: process 0 writes figures and the JSON
            _figure(
                name,
                results[f"{name}/unscaled"],
                results[f"{name}/scaled"],
                os.path.join(args.out, f"depth_{name}.png"),
            )

    if _devices.is_writer():
        _best_lr_figure(summary, os.path.join(args.out, "depth_best_lr.png"))
    table = lab.depth.depth_table(summary, cfg["depths"])
    print(table)
    payload = {
        "benchmark": "depth_transfer",
        "preset": preset,
        "config": dict(
            cfg,
            data=data.name,
            optimizers=list(opts),
            seeds=seeds,
            dtype=args.dtype,
            lr_centers={k: v[1] for k, v in opts.items()},
            base_blocks=2,
        ),
        "runs": [r for res in results.values() for r in res.runs],
        "summary": summary,
        "table": table,
        "wall_s": time.time() - t0,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "environment": cli.environment(),
    }
    if _devices.is_writer():
        cli.write_json(args.json, payload)
    return payload


def _figure(name, unscaled, scaled, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.2), sharey=True)
    for ax, res, label in ((axes[0], unscaled, "unscaled: h + f(h)"), (axes[1], scaled, "scaled: h + (2/K) f(h)")):
        s = res.summary()
        lab.plot_sweep(res, ax=ax, title=f"{name}, {label}\nspread {s['spread_steps']:.2f} steps")
    # A common y-range that shows the optima (diverged / huge losses are clipped).
    finite = [
        r["train_loss"]
        for res in (unscaled, scaled)
        for r in res.runs
        if r.get("train_loss") is not None and np.isfinite(r["train_loss"])
    ]
    if finite:
        lo = min(finite)
        # Show every depth's optimum (the unscaled deep ones sit high), clip the divergence.
        best = [v for res in (unscaled, scaled) for v in res.summary()["loss_at_best"].values() if np.isfinite(v)]
        hi = max(lo + 1.5, min(max(best) + 0.4, lo + 6.0))
        axes[0].set_ylim(lo - 0.05 * abs(lo), hi)
    fig.tight_layout()
    lab.savefig(fig, path)
    plt.close(fig)
    print(f"wrote {path}")


def _best_lr_figure(summary, path):
    """Best LR vs depth, every optimizer: scaled (solid) vs unscaled (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(k.split("/")[0] for k in summary))
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    colors = plt.get_cmap("tab10")
    for i, name in enumerate(names):
        for form, style in (("scaled", "-"), ("unscaled", "--")):
            s = summary.get(f"{name}/{form}")
            if not s:
                continue
            ks = sorted(s["best_lr"])
            lrs = [s["best_lr"][k] for k in ks]
            ax.plot(ks, lrs, style, marker="o", ms=3, color=colors(i), label=f"{name} {form} ({s['spread_steps']:.1f})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("depth K (blocks)")
    ax.set_ylabel("best learning rate")
    ax.set_title("best LR vs depth: alpha = 2/K (solid) vs 1 (dashed)\n(legend: spread in grid steps)", fontsize=9)
    ax.grid(alpha=0.3, which="both", lw=0.4)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    lab.savefig(fig, path)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
