"""Never worse than leaving the model alone: the whole recipe on a nanodo-style LM, judged against AdamW.

The experiment is :mod:`spectral_optax.lab.third_party` (its docstring has the procedure): tune the LR at the
proxy (width 32, 150 steps, batch 16), move it with ``so.transfer`` to the targets (width 128 and 256, 4x the
steps, 2x the batch), sweep each target on a ``sqrt(2)`` grid; per setup the regret (nats, grid steps), the
naive LR's regret, the target's own best loss and the loss at the transferred LR minus ``optax.adamw``'s best
at the target (on the model's own init).

    python -m benchmarks.third_party_lm [--quick | --preset quick|full] [--models tied,untied]
        [--setups muon,muon_own,mup_adamw,moga,adamw] [--framework linen|nnx] [--seeds K] [--json PATH] [--out DIR]

``--study mup_adamw``: why ``mup_adamw`` ends worse than ``optax.adamw`` at the target
(:func:`spectral_optax.lab.third_party.diagnose`): the variants of
:data:`spectral_optax.lab.third_party.MUP_VARIANTS` (``--variants``) at one reduced target (``--width``,
``--steps``, ``--batch-size``) over a factor-2 LR grid per variant (``--lrs 'name=a:b:c;*=a:b'``).

    python -m benchmarks.third_party_lm --study mup_adamw --width 128 --steps 300 --batch-size 32
        --variants tied_path,adamw,own_init --lrs '*=0.008:0.016:0.032;adamw=0.002:0.004:0.008' [--seeds K]

``--study moga``: MOGA's route balance (issue 50, item 4), the variants of
:data:`spectral_optax.lab.third_party.MOGA_VARIANTS`: the tied path at ``base_factor`` 1 / 5 / 25, the authors'
recipe (``published``; with ``--untied``, their untied head), Muon on the model's own init and the baseline;
each variant's loss against tokens seen at its best LR is printed and written to the JSON.

    python -m benchmarks.third_party_lm --study moga --untied --width 128 --steps 300 --batch-size 32
        --variants published,muon_own,adamw --lrs '*=0.004:0.008:0.016;muon_own=0.01:0.02:0.04'

Runs are appended to ``OUT/third_party_lm.jsonl`` (``OUT/third_party_lm_diagnose.jsonl`` for the study);
rerunning skips the runs already recorded.
"""

from __future__ import annotations

import time

import jax

from spectral_optax.lab import cli, third_party


def print_report(report) -> None:
    for model, rows in report.items():
        for width in next(iter(rows.values()))["targets"]:
            print(f"\n{model}, target width {width}: train loss (seed mean), regret in nats (sqrt(2)-grid steps)")
            print(
                f"  {'setup':10s} {'proxy LR':>9s} {'LR':>9s} {'regret':>15s} {'naive':>15s} {'own best':>9s} "
                f"{'vs adamw':>9s}"
            )
            for name, row in rows.items():
                t = row["targets"][width]
                edge = "  (target best on the grid's edge)" if t["at_edge"] else ""
                print(
                    f"  {name:10s} {t['proxy_lr']:9.3g} {t['lr']:9.3g} "
                    f"{t['regret']:7.3f} ({t['regret_steps']:+5.2f}) "
                    f"{t['naive_regret']:7.3f} ({t['naive_regret_steps']:+5.2f}) "
                    f"{t['best_loss']:9.3f} {t['vs_adamw']:+9.3f}{edge}"
                )


def diagnose_main(args):
    lrs = {k: [float(x) for x in v.split(":")] for k, v in (item.split("=") for item in args.lrs.split(";"))}
    variants = args.variants.split(",")
    seeds = range(args.seeds if args.seeds is not None else 1)
    print(
        f"{args.study} study ({'untied' if args.untied else 'tied'}): width {args.width}, {args.steps} steps, "
        f"batch {args.batch_size}, seeds {list(seeds)}"
    )
    t0 = time.time()
    with jax.default_matmul_precision("highest"):
        report = third_party.diagnose(
            variants,
            width=args.width,
            steps=args.steps,
            batch_size=args.batch_size,
            lrs=lrs,
            seeds=seeds,
            out=args.out,
            progress=not args.no_progress,
            study=args.study,
            tied=not args.untied,
        )
    for name, r in report.items():
        cells = "  ".join(f"{lr:.3g}: {v:.4f}" for lr, v in zip(r["lrs"], r["loss"]))
        print(f"  {name:18s} best {r['best_loss']:.4f} at {r['best_lr']:.3g}   ({cells})")
    print("\ntrain loss against tokens seen (millions), each at its best LR:")
    for name, r in report.items():
        marks = range(0, len(r["curve"]), max(1, len(r["curve"]) // 5))
        tokens = [step * r["tokens_per_step"] / 1e6 for step in r["curve_steps"]]
        cells = "  ".join(f"{tokens[i]:.2f}M: {r['curve'][i]:.3f}" for i in marks)
        print(f"  {name:18s} {cells}")
    cli.finish(
        args.json,
        {
            "benchmark": "third_party_lm",
            "study": args.study,
            "tied": not args.untied,
            "report": report,
        },
        t0,
    )
    return report


def main(argv=None):
    p = cli.parser(__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=None, choices=sorted(third_party.PRESETS))
    p.add_argument("--models", default=None, help="tied,untied (default: the preset's)")
    p.add_argument("--setups", default=None, help=f"of {list(third_party.SETUPS)} (default: the preset's)")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--framework", default="linen", choices=("linen", "nnx"), help="the Linen or the NNX model")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--study", default="recipe", choices=("recipe", *third_party.STUDIES))
    p.add_argument("--variants", default="tied_path,adamw", help="a study's variants (its table in lab.third_party)")
    p.add_argument("--untied", action="store_true", help="a study on the untied decoder (a Dense head)")
    p.add_argument("--width", type=int, default=128, help="a study's target width")
    p.add_argument("--steps", type=int, default=300, help="a study's target steps")
    p.add_argument("--batch-size", type=int, default=32, help="a study's target batch")
    p.add_argument("--lrs", default="*=0.008:0.016:0.032;adamw=0.002:0.004:0.008", help="a study's LRs per variant")
    args = p.parse_args(argv)
    if args.study != "recipe":
        return diagnose_main(args)
    preset = "quick" if args.quick else (args.preset or "full")
    cfg = third_party.PRESETS[preset]
    setups = args.setups.split(",") if args.setups else None
    models = args.models.split(",") if args.models else None
    seeds = range(args.seeds) if args.seeds is not None else None
    print(f"third-party LM ({preset}): {dict(cfg)}, backend {jax.default_backend()}")
    t0 = time.time()
    with jax.default_matmul_precision("highest"):
        report = third_party.run(
            cfg,
            out=args.out,
            setups=setups,
            models=models,
            seeds=seeds,
            tag="/quick" if preset == "quick" else "",
            progress=not args.no_progress,
            framework=args.framework,
        )
    print_report(report)
    cli.finish(
        args.json,
        {
            "benchmark": "third_party_lm",
            "preset": preset,
            "framework": args.framework,
            "config": dict(cfg),
            "report": report,
        },
        t0,
    )
    return report


if __name__ == "__main__":
    main()
