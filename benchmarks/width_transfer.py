"""Width transfer: does the best learning rate stay put as the width grows 32x?

By default a byte-level next-byte model on the embedded text (Python's
bundled documentation): ``context`` bytes, each embedded (one table row per
position and byte, rows summed) -> ReLU -> a hidden Dense layer -> ReLU ->
256 logits (``--model resmlp``: residual blocks instead). Widths 64..2048,
an LR grid of 10 factor-2 points per optimizer, for ``spectral_sgd``,
``mup_adamw``, ``muon`` and ``moga`` (when the package provides them; all
with Parametrization-1 init) and standard-parametrization ``optax.adamw``
(Flax default init) as the baseline. ``--data digits`` or
``--data cifar10:DIR`` switch the task.

For each optimizer: the best LR per width (parabola-refined in log-LR), the
**spread in grid steps** ``log2(max best LR / min best LR)``, and the train
loss at the best LR (the best LR is only meaningful while that loss stays
clearly above its floor). Runs are appended to ``OUT/width_transfer.jsonl``:
an interrupted run resumes where it stopped.

    python -m benchmarks.width_transfer [--quick | --preset default|quick|gpu] [--json PATH]
        [--out DIR] [--data text|digits|cifar10:DIR] [--model mlp|resmlp] [--optimizers a,b]
        [--widths 64,128,...] [--steps N] [--seeds K] [--muon-max-width N]
        [--dtype float32|bfloat16]

Numerics are the same on every backend (``--dtype float32``, the default:
float32 matmuls at ``Precision.HIGHEST`` and a float32 Newton-Schulz
iteration; ``--dtype bfloat16``: bfloat16 layers and iteration with float32
parameters). Budgets are by backend: on a CPU Muon stops at width 512 (the
quick preset's widest, so the quickstart runs every optimizer at every width;
the default preset's 1024 and 2048 are skipped for Muon) unless
``--muon-max-width`` says otherwise; on a GPU or TPU nothing is skipped.
``--preset gpu``: the default widths with 3 seeds.

References: Yang, Simon, Bernstein (2023); Yang et al. (2021), muP;
docs/math.md section 2.
"""

from __future__ import annotations

import os
import platform
import time

from benchmarks import _devices

_devices.early_flags()  # --devices N: before JAX starts


import spectral_optax as so  # noqa: E402
from spectral_optax import lab  # noqa: E402
from spectral_optax.lab import cli  # noqa: E402

BASE_WIDTH = 64

#: ``mup_adamw``'s embedding learning-rate multiplier: the registry's constant, tuned at the base width 64
#: (``lab.optimizer('mup_adamw').constants['width_mlp']``).
MUP_EMBEDDING_LR_SCALE = lab.optimizer("mup_adamw").constants["width_mlp"]["embedding_lr_scale"]

#: Muon's widest model on a CPU, and the registry's names run by default.
OPTIMIZERS = ("spectral_sgd", "mup_adamw", "muon", "moga", "adamw_sp")


PRESETS = {
    # widths, LR-grid points, steps, seeds; Muon's widest model on a CPU
    "quick": {"widths": [64, 128, 256, 512], "num_lrs": 8, "steps": 150, "seeds": 3, "cpu_muon_max": 512},
    "default": {
        "widths": [64, 128, 256, 512, 1024, 2048],
        "num_lrs": 10,
        "steps": 300,
        "seeds": 1,
        "cpu_muon_max": 512,
    },
    "gpu": {"widths": [64, 128, 256, 512, 1024, 2048], "num_lrs": 10, "steps": 300, "seeds": 3, "cpu_muon_max": 512},
}


def settings(preset: str, accelerator: bool, muon_max_width: int | None = None) -> dict:
    """The preset's sizes, with Muon's width budget by backend (``None``: no limit)."""
    cfg = dict(PRESETS[preset])
    cpu_max = cfg.pop("cpu_muon_max")
    cfg["muon_max_width"] = muon_max_width or (None if accelerator else cpu_max)
    return cfg


def optimizer_specs(family_for, base_width=BASE_WIDTH, ns_dtype=None, embedding_lr_scale=MUP_EMBEDDING_LR_SCALE):
    """name -> (init parametrization, LR grid center, factory(lr, width)), from the lab's registry."""
    base = family_for("spectral")(base_width).shapes()
    if not any(so.expert.route_of(g) == "embedding" for _, g in so.as_geometry_map().leaves(base)):
        embedding_lr_scale = 1.0  # dense inputs (digits, CIFAR): no embedding table to scale
    experiment = "width_dense" if embedding_lr_scale == 1 else "width_mlp"
    options = {
        "mup_adamw": {"base": base, "embedding_lr_scale": embedding_lr_scale},
        "muon": {"compute_dtype": ns_dtype},
    }
    specs = {}
    for name in OPTIMIZERS:
        opt = lab.optimizer(name)
        kw = options.get(name, {})
        specs[name] = (opt.init, opt.center(experiment), lambda lr, n, opt=opt, kw=kw: opt(lr, **kw))
    return specs


def main(argv=None):
    p = cli.parser(__doc__.split("\n\n")[0])
    p.add_argument("--data", default="text", help="text | text:PATH | digits | cifar10:DIR | cifar100:DIR")
    p.add_argument("--model", default="mlp", choices=("mlp", "resmlp"))
    p.add_argument("--optimizers", default=None, help="comma-separated subset")
    p.add_argument("--widths", default=None, help="comma-separated widths")
    p.add_argument("--num-lrs", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--context", type=int, default=8)
    p.add_argument(
        "--muon-max-width",
        type=int,
        default=None,
        help="widest Muon model (default: 512 on a CPU, where Newton-Schulz is O(n^3) per step; no limit on a GPU/TPU)",
    )
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="sizes (--quick = --preset quick)")
    p.add_argument(
        "--mup-embedding-lr-scale",
        type=float,
        default=MUP_EMBEDDING_LR_SCALE,
        help=f"mup_adamw's embedding LR multiplier (default {MUP_EMBEDDING_LR_SCALE:g}; 1: plain mup_adamw)",
    )
    cli.add_dtype_argument(p)
    p.add_argument("--no-progress", action="store_true")
    _devices.add_arguments(p)
    args = p.parse_args(argv)
    devices = _devices.setup(args)

    preset = args.preset or ("quick" if args.quick else "default")
    quick = preset == "quick"
    accelerator = cli.on_accelerator()
    cfg = settings(preset, accelerator, args.muon_max_width)
    widths = [int(w) for w in args.widths.split(",")] if args.widths else cfg["widths"]
    num_lrs = args.num_lrs or cfg["num_lrs"]
    steps = args.steps or cfg["steps"]
    batch_size = args.batch_size or 32
    seeds = list(range(args.seeds or cfg["seeds"]))
    muon_max = cfg["muon_max_width"]
    model_dtype, ns_dtype, numerics = cli.lab_numerics(args.dtype)

    data = lab.load(args.data, context=args.context, flatten=True)
    residual = args.model == "resmlp"
    depth = 2 if residual else 1

    def family_for(init):
        return lab.mlp_family(
            data,
            vary="width",
            depth=depth,
            residual=residual,
            alpha=0.5 if residual else None,
            init=init,
            compute_dtype=model_dtype,
        )

    specs = optimizer_specs(family_for, ns_dtype=ns_dtype, embedding_lr_scale=args.mup_embedding_lr_scale)
    if args.optimizers:
        wanted = args.optimizers.split(",")
        unknown = [w for w in wanted if w not in specs]
        if unknown:
            raise SystemExit(f"unknown or unavailable optimizers {unknown}; have {list(specs)}")
        specs = {k: v for k, v in specs.items() if k in wanted}
    results_path = os.path.join(args.out, "width_transfer.jsonl")
    tag = (
        f"{args.model}/ctx{args.context}" + ("/quick" if quick else "") + ("/bf16" if args.dtype == "bfloat16" else "")
    )
    print(
        f"width transfer: data={data.name}, model={args.model}, widths={widths}, "
        f"{num_lrs} LRs (x2), {steps} steps, batch {batch_size}, seeds {seeds}, {args.dtype}, "
        f"backend {cli.environment()['backend']}, data fingerprint {cli.data_fingerprint(data)}"
        + (f" (Python {platform.python_version()}'s bundled text: compare yours)" if data.name == "text:pydoc" else "")
    )
    t0 = time.time()
    results, summaries, skipped = {}, {}, {}
    for name, (init, center, factory) in specs.items():
        ws = widths
        if name == "muon" and muon_max is not None:
            ws = [w for w in widths if w <= muon_max]
            if len(ws) < len(widths):
                skipped[name] = [w for w in widths if w > muon_max]
        t = time.time()
        with numerics():  # traced and run at the chosen precision
            res = lab.sweep(
                family_for(init),
                factory,
                ws,
                lab.lr_grid(center, num_lrs),
                data,
                steps=steps,
                batch_size=batch_size,
                seeds=seeds,
                results=results_path,
                name=name,
                tag=tag + (f"/emb{args.mup_embedding_lr_scale:g}" if name == "mup_adamw" else ""),
                size_name="width",
                progress=not args.no_progress,
                devices=devices,
            )
        results[name] = res
        summaries[name] = s = res.summary()
        print(
            f"\n{name} ({init} init, {time.time() - t:.0f} s): spread {s['spread_steps']:.2f} "
            f"grid steps over widths {ws[0]}..{ws[-1]}"
        )
        print("  width    best LR   loss@best  diverged" + ("  (edge)" if s["at_edge"] else ""))
        for w in ws:
            edge = "  at grid edge" if w in s["at_edge"] else ""
            print(
                f"  {w:5d}  {s['best_lr'][w]:9.3g}  {s['loss_at_best'][w]:9.4f}  {s['diverged'][w]:8d}{edge}",
                flush=True,
            )
    elapsed = time.time() - t0

    print("\nsummary (spread in grid steps of x2; loss = train loss at the best LR):")
    print(f"  {'optimizer':14s} {'spread':>7s}  {'widths':>12s}  loss@best (per width)")
    for name, s in summaries.items():
        ws = sorted(s["best_lr"])
        losses = " ".join(f"{s['loss_at_best'][w]:.3f}" for w in ws)
        print(f"  {name:14s} {s['spread_steps']:7.2f}  {f'{ws[0]}..{ws[-1]}':>12s}  {losses}")
    if skipped:
        print(f"  (not run, {'--muon-max-width' if args.muon_max_width else 'CPU budget'}: {skipped})")
    regrets = lab.widest_regret(results, summaries)
    print("\nregret at the widest width (train loss at the narrowest width's best grid LR - the widest's own best):")
    print(f"  {'optimizer':14s} {'widths':>10s} {'LR':>9s} {'loss':>8s} {'best':>8s} {'regret':>8s} {'steps':>6s}")
    for name, r in regrets.items():
        span = f"{r['narrow']}->{r['wide']}"
        print(
            f"  {name:14s} {span:>10s} {r['lr']:9.3g} {r['loss']:8.4f} "
            f"{r['best_loss']:8.4f} {r['regret']:+8.4f} {r['regret_steps']:+6.2f}"
        )
    verdict = lab.transfer_verdict(regrets)
    print(f"\nverdict (transfers: regret of the seed-mean curves <= {lab.REGRET_TOLERANCE:g} nats):")
    for name, v in verdict.items():
        print(
            f"  {name:14s} {v['verdict']:10s} margin {v['margin']:+.4f}  (each seed's own: "
            + " ".join(f"{x:+.4f}" for x in v["per_seed"])
            + ")"
        )
    fig = os.path.join(args.out, "width_transfer.png")
    if not _devices.is_writer():  # multi-host: process 0 writes the figure and the JSON
        return summaries
    lab.plot_sweeps(
        results, fig, suptitle=f"width transfer: {data.name}, {args.model}, {steps} steps x batch {batch_size}"
    )
    print(f"figure: {fig}   results: {results_path}   ({elapsed:.0f} s)")
    cli.write_json(
        args.json,
        {
            "benchmark": "width_transfer",
            "preset": preset,
            "quick": quick,
            "dtype": args.dtype,
            "data": data.name,
            "model": args.model,
            "widths": widths,
            "num_lrs": num_lrs,
            "steps": steps,
            "batch_size": batch_size,
            "seeds": seeds,
            "grid_ratio": 2.0,
            "skipped_widths": skipped,
            "runs": [r for res in results.values() for r in res.runs],
            "summary": {
                k: {
                    kk: s[kk]
                    for kk in ("best_lr", "spread_steps", "loss_at_best", "best_lr_grid", "at_edge", "diverged")
                }
                for k, s in summaries.items()
            },
            "regret": regrets,
            "verdict": verdict,
            "regret_tolerance": lab.REGRET_TOLERANCE,
            "data_fingerprint": cli.data_fingerprint(data),
            "figure": fig,
            "seconds": elapsed,
            "environment": cli.environment(),
        },
    )
    return summaries


if __name__ == "__main__":
    main()
