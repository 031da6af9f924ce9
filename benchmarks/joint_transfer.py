"""One learning rate across width and depth at once.

Residual MLPs (``spectral_optax.lab.mlp_family``: byte-level next-byte
prediction on the embedded text, blocks ``h + (2/K) f(h)``, Parametrization-1
init) at every width x depth of a 3 x 3 grid, each swept over a factor-2 grid
of peak LRs (5% warm-up, cosine decay), for ``muon`` and ``moga`` (p = 2),
with AdamW under muP (``mup_adamw``, base width 64) as the comparison. The
claim under test: the best LR of all nine configurations lies within one
grid step (factor 2).

    python -m benchmarks.joint_transfer [--quick] [--model mlp|gpt] [--json PATH] [--out DIR] [--seeds K]
        [--optimizers muon,moga,mup_adamw] [--widths 64,128,256] [--depths 2,8,32] [--steps N]
        [--num-lrs N] [--batch-size B]

``--model gpt``: the package's GPT instead (``lab.gpt_family``: pre-LN decoder, fused QKV, heads of width
16, ``h + (2/K) f(h)``, Parametrization-1 init) on byte sequences of 64, widths 32, 64, 128 x depths 2, 4, 8
(``--quick``: widths 32, 64 x depths 2, 8, 60 steps).

JSON ``summary``: keyed by optimizer (``"muon"``, ``"moga"``, ``"mup_adamw"``),
each with ``best_lr`` per configuration (``"w{width}/K{depth}"``, train loss),
``best_lr_val`` (validation loss), ``spread_steps`` and ``spread_steps_val``
over all nine, ``loss_at_best``, ``at_edge``, ``diverged``. Figure
``OUT/joint_transfer_<preset>.png``: best LR against width, one curve per depth,
the grey band one grid step wide around the median.

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
from spectral_optax.lab.cli import environment, write_json  # noqa: E402

PRESETS = {
    # A smoke test (<= 4 min on 2 cores): a smaller 3 x 3 grid. Muon's cost is dominated by Newton-Schulz
    # (~15 d^3 flops per hidden matrix per step per LR, 2K matrices), so width 256 x depth 32 alone costs
    # ~5e10 flops per step per LR: the grid is the default preset's.
    "quick": {"widths": (32, 64, 128), "depths": (2, 4, 16), "steps": 80, "num_lrs": 5, "batch_size": 32,
              "optimizers": ("muon", "moga", "mup_adamw")},
    "cpu": {"widths": (64, 128, 256), "depths": (2, 8, 32), "steps": 150, "num_lrs": 6, "batch_size": 64,
            "optimizers": ("muon", "moga", "mup_adamw")},
}
GPT_PRESETS = {
    "quick": {"widths": (32, 64), "depths": (2, 8), "steps": 60, "num_lrs": 5, "batch_size": 8,
              "optimizers": ("muon", "moga", "mup_adamw"), "context": 64},
    "cpu": {"widths": (32, 64, 128), "depths": (2, 4, 8), "steps": 120, "num_lrs": 5, "batch_size": 8,
            "optimizers": ("muon", "moga", "mup_adamw"), "context": 64},
}
BASE_WIDTH = 64


def _code(width: int, depth: int) -> int:
    """One sweep 'size' per configuration: width * 1000 + depth."""
    return width * 1000 + depth


def _decode(size: int) -> tuple[int, int]:
    return size // 1000, size % 1000


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke-test preset")
    p.add_argument("--model", choices=("mlp", "gpt"), default="mlp", help="residual MLP (default) or the GPT")
    p.add_argument("--json", default=None)
    p.add_argument("--out", default="out")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--optimizers", default=None, help="comma-separated subset of muon,moga,mup_adamw")
    p.add_argument("--widths", default=None)
    p.add_argument("--depths", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--num-lrs", type=int, default=None, help="LR-grid points (overrides the preset)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (overrides the preset)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--muon-head", choices=("muon", "adamw"), default="muon",
                   help="route of Muon's output head (so.muon(output=...); default muon)")
    p.add_argument("--moga-head-base", type=float, default=None, metavar="W",
                   help="MOGA's width-consistent head (so.moga(head_base_width=W)) instead of the published one")
    _devices.add_arguments(p)
    args = p.parse_args(argv)
    devices = _devices.setup(args)
    preset = "quick" if args.quick else "cpu"
    gpt = args.model == "gpt"
    cfg = dict((GPT_PRESETS if gpt else PRESETS)[preset])
    experiment = "joint_gpt" if gpt else "joint_mlp"
    centers = {name: lab.optimizer(name).center(experiment) for name in ("muon", "moga", "mup_adamw")}
    for key in ("widths", "depths"):
        if getattr(args, key):
            cfg[key] = tuple(int(v) for v in getattr(args, key).split(","))
    for key in ("steps", "num_lrs", "batch_size"):
        if getattr(args, key):
            cfg[key] = getattr(args, key)
    if args.optimizers:
        cfg["optimizers"] = tuple(args.optimizers.split(","))
    unknown = [o for o in cfg["optimizers"] if o not in centers]
    if unknown:
        raise SystemExit(f"unknown optimizers {unknown}; have {list(centers)}")

    if preset == "quick":
        print(cli.SMOKE_NOTE.format(benchmark="joint_transfer", preset="cpu").replace(
            " --preset cpu", " --model gpt" if gpt else ""), flush=True)
    if gpt:
        data = lab.load("text", context=cfg["context"], sequence=True)

        def depth_family(w):
            return lab.gpt_family(data, vary="depth", width=w, init="spectral")
    else:
        data = lab.load("text", context=8)

        def depth_family(w):
            return lab.mlp_family(data, vary="depth", width=w, residual=True, alpha=lambda k: 2 / k, init="spectral")

    families = {w: depth_family(w) for w in cfg["widths"]}

    def family(size):
        w, d = _decode(size)
        return families[w](d)

    def factory(name):
        """The lab registry's configuration of ``name``, with the head options of the command line."""
        opt = lab.optimizer(name)
        if name == "muon":
            return lambda lr: opt(lr, output=args.muon_head)
        if name == "moga":
            return lambda lr: opt(lr, **moga_options)
        bases = {d: depth_family(BASE_WIDTH)(d).shapes() for d in cfg["depths"]}
        return lambda lr, size: opt(lr, base=bases[_decode(size)[1]])

    moga_options = {} if args.moga_head_base is None else {"head_base_width": args.moga_head_base}
    tags = {"moga": "".join(f"-{k}={v}" for k, v in moga_options.items()),
            "muon": "" if args.muon_head == "muon" else f"-output={args.muon_head}"}
    sizes = [_code(w, d) for d in cfg["depths"] for w in cfg["widths"]]
    os.makedirs(args.out, exist_ok=True)
    stem = f"joint_transfer_{'gpt_' if gpt else ''}{preset}"
    results_path = os.path.join(args.out, f"{stem}.jsonl")
    t0 = time.time()
    summary, results = {}, {}
    for name in cfg["optimizers"]:
        res = lab.sweep(family, factory(name), sizes, lab.lr_grid(centers[name], cfg["num_lrs"]), data,
                        steps=cfg["steps"], batch_size=cfg["batch_size"], seeds=list(range(args.seeds)),
                        results=results_path, size_name="config",
                        name=f"joint{'/gpt' if gpt else ''}/{name}{tags.get(name, '')}",
                        schedule="warmup_cosine", eval_examples=1024, progress=not args.no_progress,
                        devices=devices)
        results[name] = res
        both = res.summaries()
        tr, va = both["train"], both["val"]

        def by_config(d):
            return {f"w{_decode(s)[0]}/K{_decode(s)[1]}": v for s, v in d.items()}

        summary[name] = {
            "best_lr": by_config(tr["best_lr"]), "best_lr_val": by_config(va["best_lr"]),
            "spread_steps": tr["spread_steps"], "spread_steps_val": va["spread_steps"],
            "loss_at_best": by_config(tr["loss_at_best"]), "val_loss_at_best": by_config(va["loss_at_best"]),
            "at_edge": [f"w{_decode(s)[0]}/K{_decode(s)[1]}" for s in tr["at_edge"]],
            "diverged": by_config(tr["diverged"]), "grid_ratio": tr["grid_ratio"],
        }
        print(f"[{time.time() - t0:6.0f}s] {name}: spread {tr['spread_steps']:.2f} grid steps (train), "
              f"{va['spread_steps']:.2f} (val) over {len(sizes)} configurations; at edge "
              f"{summary[name]['at_edge']}", flush=True)
    if not _devices.is_writer():  # multi-host: process 0 writes figures and the JSON
        return summary
    model = "GPT, pre-LN, fused QKV" if gpt else "residual MLP"
    fig = _figure(summary, cfg, os.path.join(args.out, f"{stem}.png"), centers, model)
    table = _table(summary, cfg)
    print(table)
    write_json(args.json, {
        "benchmark": "joint_transfer", "preset": preset, "model": args.model,
        "config": dict(cfg, data=data.name, seeds=args.seeds, schedule="warmup_cosine", base_blocks=2,
                       lr_centers={k: centers[k] for k in cfg["optimizers"]}, mup_base_width=BASE_WIDTH,
                       moga_options=moga_options, muon_head=args.muon_head),
        "summary": summary, "table": table, "figure": fig,
        "runs": [r for res in results.values() for r in res.runs],
        "wall_s": time.time() - t0, "environment": environment(),
    })
    return summary


def _figure(summary, cfg, path, centers, model):
    """Best peak LR against width, one curve per depth, one column per optimizer; train loss (top row)
    and validation loss (bottom row); the grey band is one grid step (x2) wide around the median."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, axes = plt.subplots(2, len(names), figsize=(3.3 * len(names), 5.6), squeeze=False)
    colors = plt.get_cmap("viridis")
    for j, name in enumerate(names):
        s = summary[name]
        grid = lab.lr_grid(centers[name], cfg["num_lrs"])
        for i, (key, spread, what) in enumerate((("best_lr", "spread_steps", "train"),
                                                 ("best_lr_val", "spread_steps_val", "val"))):
            ax = axes[i, j]
            ax.set_ylim(grid[0] / 1.2, grid[-1] * 1.2)  # the whole LR grid: the band reads at a glance
            allv = [v for v in s[key].values() if v is not None and np.isfinite(v)]
            if allv:
                mid = float(np.exp(np.median(np.log(allv))))
                ax.axhspan(mid / np.sqrt(2), mid * np.sqrt(2), color="0.85", zorder=0,
                           label="one grid step (x2)")
            for k, d in enumerate(cfg["depths"]):
                lrs = [s[key].get(f"w{w}/K{d}", np.nan) for w in cfg["widths"]]
                ax.plot(cfg["widths"], lrs, marker="o", ms=4, color=colors(k / max(1, len(cfg["depths"]) - 1)),
                        label=f"depth {d}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("width", fontsize=8)
            ax.set_title(f"{name} ({what}): spread {s[spread]:.2f} grid steps", fontsize=9)
            ax.grid(alpha=0.3, which="both", lw=0.4)
            if j == 0:
                ax.set_ylabel(f"best peak LR ({what} loss)", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"one LR across width x depth ({model}, h + (2/K) f(h), Parametrization 1)", fontsize=9)
    fig.tight_layout()
    lab.savefig(fig, path)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def _table(summary, cfg):
    configs = [f"w{w}/K{d}" for d in cfg["depths"] for w in cfg["widths"]]
    rows = ["| optimizer | " + " | ".join(configs) + " | spread train | spread val |",
            "|" + "---|" * (len(configs) + 3)]
    for name, s in summary.items():
        cells = [f"{s['best_lr'].get(c, float('nan')):.3g}" + ("*" if c in s["at_edge"] else "") for c in configs]
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {s['spread_steps']:.2f} | {s['spread_steps_val']:.2f} |")
    rows.append("(best peak LR on train loss; * = at the edge of the grid)")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
