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
init, ``muon_own`` / ``moga_own`` Muon / MOGA (as published) on the model's
own init (no reinitialize, no multiplier: the model left alone),
``moga_adam_tables`` an ablation (MOGA with Adam instead of sign steps on the
tables, norm scales and biases). ``--readout-base-width c``
sets the tied multiplier to ``c / d`` (muP's ``output_mult``; default 1).

``--tune`` is muTransfer's procedure for the parametrization's Theta(1)
constants (``lab.tied.DEFAULT_CONSTANTS``: the read-out's ``c``, the tables' LR
multiplier and init standard deviation, MOGA's ``base_factor``, its head rule
and Adam-or-sign tables):
every combination of ``lab.tied.TUNE_GRID`` is swept at the proxy width only (its
LR grid moved off an edge), the one with the lowest proxy loss is kept, and
the LR is transferred with it fixed. ``--constants`` fixes them by hand.

    python -m benchmarks.tied_transfer [--quick | --preset quick|default] [--json PATH] [--out DIR]
        [--models tied,untied] [--optimizers a,b] [--widths 32,128] [--steps N] [--seeds K] [--num-lrs N]
        [--readout-base-width C] [--centers name=lr,...] [--tune] [--constants muon:rb=4:emb=4,...]
        [--batch-size B] [--context T] [--eval-examples N]

Targets (issue 35): spread <= 0.5 grid steps, regret <= 0.01 nats, and the
widest model's loss at its best LR no worse than ``adamw_sp``'s best.
Runs are appended to ``OUT/tied_transfer.jsonl`` (an interrupted run
resumes).
"""

from __future__ import annotations

import math
import os
import time

import jax

from spectral_optax import lab
from spectral_optax.lab import cli
from spectral_optax.lab import tied as study

PRESETS = {
    # widths (the first is the proxy), LR-grid points, steps, seeds, context, batch size
    "quick": {"widths": [32, 128], "num_lrs": 5, "steps": 80, "seeds": 2, "context": 32, "batch_size": 8},
    "default": {"widths": [32, 128, 256], "num_lrs": 6, "steps": 150, "seeds": 2, "context": 64, "batch_size": 16},
}
#: Validation examples per run (the targets use the train loss). The end-of-run evaluation is one vmapped
#: program over every run of a width: 2048 sequences of 64 at width 256 ask for about 40 GB on CPU.
EVAL_EXAMPLES = {"quick": 2048, "default": 256}


def run(
    *,
    models=("tied", "untied"),
    optimizers=study.DEFAULT_OPTIMIZERS,
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
    eval_examples=2048,
    tune=False,
    constants=None,
):
    """Sweep every (model, optimizer); returns ``{model: {'summary', 'regret', 'results', 'constants', 'tuning'}}``.

    ``constants``: ``{optimizer: {key: value}}`` over ``lab.tied.DEFAULT_CONSTANTS`` (``readout_base`` sets
    every ``rb``). ``tune``: for the optimizers of ``lab.tied.TUNE_GRID``, first sweep the proxy width
    (``widths[0]``) over every combination of constants (``lab.tied.tune_grid``), keep the one with the lowest
    proxy loss at its best LR, then sweep every width with it (the proxy's runs are reused).
    """
    data = lab.load("text", context=context, sequence=True)
    results_path = os.path.join(out, "tied_transfer.jsonl")
    sweep_kw = {  # lab.sweep's settings shared by every sweep
        "steps": steps,
        "batch_size": batch_size,
        "seeds": seeds,
        "results": results_path,
        "size_name": "width",
        "eval_examples": eval_examples,
        "schedule": "warmup_cosine",
        "progress": progress,
    }
    report = {}
    for model_name in models:
        tied = model_name == "tied"
        cache: dict = {}

        def built(d, init, rb, es=1.0, tied=tied, cache=cache):
            if (d, init, rb, es) not in cache:
                cache[d, init, rb, es] = study.make_model(
                    d, data, tied=tied, init=init, readout_base=rb, embedding_std=es
                )
            return cache[d, init, rb, es]

        base = built(widths[0], "spectral", 1.0)[0].shapes()

        def sweep(name, consts, ws, center, model_name=model_name, built=built, base=base):
            init = "own" if lab.optimizer(name).init == "standard" else "spectral"
            rb = consts["rb"] if (tied and init == "spectral") else 1.0
            es = consts["es"] if init == "spectral" else 1.0
            factory = study.optimizer_factory(
                name, lambda d: built(d, init, rb, es)[1], base, consts=consts, proxy_width=widths[0]
            )
            grid = lab.lr_grid(center, num_lrs)
            run_tag = f"{model_name}/ctx{context}{tag}" + (study.constants_tag(consts) if init == "spectral" else "")
            model_fn = lambda d: built(d, init, rb, es)[0]
            return lab.sweep(model_fn, factory, ws, grid, data, name=name, tag=run_tag, **sweep_kw)

        def proxy_sweep(name, consts, center):
            """The proxy's sweep, its grid moved by two points (4x) while its best LR is on an edge (at most twice)."""
            res = sweep(name, consts, widths[:1], center)
            for _ in range(2):
                s = res.summary()
                if not s["at_edge"]:
                    break
                lo = s["best_lr_grid"][widths[0]] <= min(r["lr"] for r in res.runs)
                center = center / 4 if lo else center * 4
                res = sweep(name, consts, widths[:1], center)
            return res, center

        results, summaries, chosen, tuning, todo = {}, {}, {}, {}, []
        for name in optimizers:  # the proxy first, for every optimizer (cheap), then the wider widths
            consts = study.constants_for(name, readout_base, constants)
            center = study.center_for(name, model_name, consts, centers)
            if tune and name in study.TUNE_GRID:
                rows = []
                for combo in study.tune_grid(name, tied):
                    res, c = proxy_sweep(name, combo, study.center_for(name, model_name, combo, centers))
                    s = res.summary()
                    rows.append(
                        {
                            **combo,
                            "center": c,
                            "best_lr": s["best_lr"][widths[0]],
                            "loss": s["loss_at_best"][widths[0]],
                            "at_edge": bool(s["at_edge"]),
                        }
                    )
                best = min(rows, key=lambda r: r["loss"] if r["loss"] == r["loss"] else math.inf)
                consts = {k: best[k] for k in study.DEFAULT_CONSTANTS}
                center, tuning[name] = best["center"], rows
            elif centers is None or name not in centers:
                _, center = proxy_sweep(name, consts, center)
            todo.append((name, consts, center))
        for name, consts, center in todo:
            res = sweep(name, consts, widths, center)
            results[name], summaries[name], chosen[name] = res, res.summary(), consts
        report[model_name] = {
            "summary": summaries,
            "regret": lab.widest_regret(results, summaries),
            "results": results,
            "constants": chosen,
            "tuning": tuning,
        }
    return report


def print_report(report, widths) -> None:
    for model_name, r in report.items():
        for name, rows in r.get("tuning", {}).items():
            print(f"\n{model_name} / {name}: constants tuned at width {widths[0]} (loss at the best LR)")
            for row in sorted(rows, key=lambda row: row["loss"]):
                cs = " ".join(f"{k}={row[k]:g}" for k in study.DEFAULT_CONSTANTS)
                edge = "  (edge)" if row["at_edge"] else ""
                print(f"  {cs}  best LR {row['best_lr']:.3g}  loss {row['loss']:.4f}{edge}")
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
            cs = study.constants_tag(r.get("constants", {}).get(name, study.DEFAULT_CONSTANTS))
            if cs and lab.optimizer(name).init == "spectral":
                print(f"  {'':10s} constants {cs}")


def main(argv=None):
    p = cli.parser(__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="sizes (--quick = --preset quick)")
    p.add_argument("--models", default="tied,untied")
    p.add_argument("--optimizers", default=",".join(study.DEFAULT_OPTIMIZERS), help=f"of {sorted(study.OPTIMIZERS)}")
    p.add_argument("--widths", default=None)
    p.add_argument("--num-lrs", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: the preset's)")
    p.add_argument("--context", type=int, default=None, help="tokens per sequence (default: the preset's)")
    p.add_argument(
        "--eval-examples", type=int, default=None, help="validation sequences per run (default: the preset's)"
    )
    p.add_argument(
        "--readout-base-width",
        type=float,
        default=1.0,
        help="c of the tied read-out multiplier c / d (tied_readout_multiplier's base_width; default 1: 1 / d)",
    )
    p.add_argument("--centers", default=None, help="LR grid centers, e.g. muon=0.04,moga=0.016 (both models)")
    p.add_argument(
        "--tune",
        action="store_true",
        help="tune the Theta(1) constants (TUNE_GRID: read-out c, tables' LR multiplier, MOGA's base_factor) "
        "at the proxy width, then transfer the LR with them fixed",
    )
    p.add_argument("--constants", default=None, help="fixed constants, e.g. muon:rb=4:emb=0.25,moga:bf=5")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    preset = args.preset or ("quick" if args.quick else "default")
    cfg = dict(PRESETS[preset])
    if args.widths:
        cfg["widths"] = [int(w) for w in args.widths.split(",")]
    for k in ("num_lrs", "steps", "seeds", "batch_size", "context"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    cfg["seeds"] = list(range(cfg["seeds"]))
    models = args.models.split(",")
    optimizers = args.optimizers.split(",")
    unknown = [o for o in optimizers if o not in study.OPTIMIZERS] + [m for m in models if m not in ("tied", "untied")]
    if unknown:
        raise SystemExit(
            f"unknown optimizers or models {unknown}; optimizers: {sorted(study.OPTIMIZERS)}, models: tied,untied"
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
            eval_examples=args.eval_examples or EVAL_EXAMPLES[preset],
            tune=args.tune,
            constants=study.parse_constants(args.constants),
            readout_base=args.readout_base_width,
            centers={k: float(v) for k, v in (kv.split("=") for kv in args.centers.split(","))}
            if args.centers
            else None,
            **cfg,
        )
    print_report(report, cfg["widths"])
    cli.finish(
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
            "tune": args.tune,
            "constants": {m: r["constants"] for m, r in report.items()},
            "tuning": {m: r["tuning"] for m, r in report.items()},
            "runs": {m: [x for res in r["results"].values() for x in res.runs] for m, r in report.items()},
        },
        t0,
    )
    return report


if __name__ == "__main__":
    main()
