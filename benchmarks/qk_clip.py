"""QK-clip on the GPT: does Muon's max attention logit grow, and does ``so.qk_clip`` hold it at tau?

The package's decoder (``lab.gpt_family``'s: ``spectral_optax.nn.linen.Transformer``, fused QKV,
Parametrization-1 init as in ``benchmarks.gpt_width``) with ``record_max_logits=True`` on byte-level
next-byte prediction over the embedded text, trained by ``so.muon`` at a constant (high) learning
rate, without and with ``so.qk_clip(tau)`` chained after it, every seed of a condition in one
``lab.sweep`` (its init and data order; the logits go to the update through ``update_args``). Every
step records the per-layer max logit (max over heads) of the batch (``step_metrics``); at the end
(``final_metrics``), the weight-only bound ``so.diagnostics.qk_logit_bound`` (inputs of RMS 1) next to
the trained parameters' real max logit on a fixed batch.

    python -m benchmarks.qk_clip [--lr 0.2] [--tau 20] [--steps 400] [--width 64] [--depth 2]
        [--seeds 2] [--context 64] [--batch-size 8] [--out DIR] [--json PATH]

Outputs in OUT: ``qk_clip.png`` (max logit per layer over steps, clipped and unclipped) and,
with ``--json``, every run's curves and final losses.

``--width-sweep`` instead runs ``benchmarks.gpt_width``'s Muon sweep (its ``quick`` preset:
widths 32, 64, 128, depth 2, context 32, batch 8, 80 steps, the registry's factor-2 grid of 5
peak LRs around Muon's ``gpt_width`` centre, 5% warm-up + cosine, 2 seeds) twice, without and
with ``so.qk_clip(tau)``, through ``lab.sweep``: the max logits of each step's forward pass go
to the update (``update_args``), the clip is chained after the schedule's multiplier
(``after_schedule``: a multiplier after it would undo it) and every step's clipped heads and
peak logit are recorded (``step_metrics``). Reported per condition: the best LR per width, its
spread in grid steps, the regret (nats and grid steps) at the widest width of the narrowest
width's best grid LR (``lab.regret``), and how many heads the clip scaled (head-steps with
``S^h > tau``).

    python -m benchmarks.qk_clip --width-sweep [--tau 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import time

import jax.numpy as jnp
import numpy as np

import spectral_optax as so
from spectral_optax import lab
from spectral_optax.lab import cli

#: ``--width-sweep``: ``benchmarks.gpt_width``'s quick preset (its Muon LR grid: the registry's ``gpt_width`` centre).
WIDTH_SWEEP = {"widths": (32, 64, 128), "depth": 2, "context": 32, "batch_size": 8, "steps": 80, "num_lrs": 5,
               "seeds": 2}


def clip_runs(data, *, width, depth, lr, tau, steps, seeds, batch_size, clip):
    """One record per seed (``lab.sweep``'s run record plus ``clip``, ``tau``, ``width``, ``depth``, ``loss``,
    ``max_logit``, ``final_loss``, ``end_max_logit``, ``end_bound``) of ``so.muon(lr)`` at a constant LR on one
    width of ``gpt_width``'s GPT family, without (``clip=False``) or with ``so.qk_clip(tau)`` chained after it.

    Through ``lab.sweep`` (the seeds vmapped, its data order): the max logits of each step's forward pass go to
    the update (``update_args``); ``max_logit`` is every step's per-layer max logit (max over heads,
    ``step_metrics``); ``end_max_logit`` the trained parameters' per-layer max logit on a fixed batch of
    ``batch_size`` evenly spaced training windows and ``end_bound`` their per-layer weight-only bound
    ``so.diagnostics.qk_logit_bound`` (inputs of RMS 1) (``final_metrics``); ``loss`` every step's minibatch
    loss; ``final_loss`` the mean of the last 5% of them (``lab.sweep``'s ``train_loss``)."""
    family = lab.gpt_family(data, vary="width", depth=depth, init="spectral", record_max_logits=True)
    model = family(width)
    geometry = model.geometry(data.numpy_batch("train", [0])[0])
    heads = max(1, width // 16)
    xb, yb = (jnp.asarray(a) for a in data.numpy_batch("train", np.arange(batch_size) * (data.num_train // batch_size)))

    def end_metrics(p):
        _, ml = model.loss_with_aux(p, xb, yb)
        bound = so.diagnostics.qk_logit_bound(p, geometry, num_heads=heads)["blocks/attn"]
        return {"max_logit": ml["blocks/attn"].max(-1), "bound": bound.max(-1)}

    res = lab.sweep(
        family,
        lambda lr: so.muon(lr, geometry=geometry),
        [width],
        [lr],
        data,
        steps=steps,
        batch_size=batch_size,
        seeds=seeds,
        name=f"qk_clip({tau:g})" if clip else "muon",
        tag=f"qk_clip/run/d{depth}",
        size_name="width",
        eval_examples=256,
        curve_points=steps,
        progress=False,
        update_args=lambda ml: {"max_logits": ml},
        step_metrics=lambda ml: {"max_logit": ml["blocks/attn"].max(-1)},
        after_schedule=(lambda w: so.qk_clip(tau, geometry=geometry)) if clip else None,
        final_metrics=lambda w: end_metrics,
    )
    return [
        {
            **r,
            "clip": clip,
            "tau": tau,
            "width": width,
            "depth": depth,
            "loss": r["curve"],
            "max_logit": r["step_metrics"]["max_logit"],
            "final_loss": r["train_loss"],
            "end_max_logit": r["final_metrics"]["max_logit"],
            "end_bound": r["final_metrics"]["bound"],
        }
        for r in res.runs
    ]


def width_sweep_runs(data, cfg, *, lrs, tau, clip, results=None):
    """Run records (``lab.sweep``'s, plus ``clipped_head_steps``, ``head_steps``, ``peak_max_logit``) of the
    registry's Muon on ``gpt_width``'s GPT family, every (width, LR, seed) of the grid, warm-up + cosine, without
    (``clip=False``) or with ``so.qk_clip(tau)`` chained after the schedule (``lab.sweep``'s ``after_schedule``:
    the clip caps the step as applied), the max logits of every step's forward pass passed to the update."""
    family = lab.gpt_family(data, vary="width", depth=cfg["depth"], init="spectral", record_max_logits=True)
    example_x = data.numpy_batch("train", [0])[0]
    muon = lab.optimizer("muon")
    res = lab.sweep(
        family,
        lambda lr: muon(lr),
        cfg["widths"],
        lrs,
        data,
        steps=cfg["steps"],
        batch_size=cfg["batch_size"],
        seeds=list(range(cfg["seeds"])),
        results=results,
        name=f"qk_clip({tau:g})" if clip else "muon",
        tag=f"qk_clip/d{cfg['depth']}",
        size_name="width",
        eval_examples=256,
        progress=False,
        schedule="warmup_cosine",
        update_args=lambda ml: {"max_logits": ml},
        step_metrics=lambda ml: {
            "clipped_heads": jnp.sum(ml["blocks/attn"] > tau),
            "max_logit": jnp.max(ml["blocks/attn"]),
        },
        after_schedule=(lambda w: so.qk_clip(tau, geometry=family(w).geometry(example_x))) if clip else None,
    )
    runs = []
    for r in res.runs:
        m = r["step_metrics"]
        heads = cfg["depth"] * max(1, int(r["size"]) // 16)
        runs.append({
            **r,
            "clipped_head_steps": int(np.nansum(np.asarray(m["clipped_heads"], float))),
            "head_steps": int(r["steps"]) * heads,
            "peak_max_logit": float(np.nanmax(np.asarray(m["max_logit"], float))),
        })
    return runs


def width_sweep(args):
    """``--width-sweep``: see the module docstring."""
    cfg = dict(WIDTH_SWEEP)
    data = lab.load("text", context=cfg["context"], sequence=True)
    widths = list(cfg["widths"])
    lrs = lab.optimizer("muon").grid("gpt_width", cfg["num_lrs"])
    t0 = time.time()
    result = {}
    for clip in (False, True):
        runs = width_sweep_runs(data, cfg, lrs=lrs, tau=args.tau, clip=clip)
        summary = lab.exponent_summaries(runs, widths)
        name = f"qk_clip({args.tau:g})" if clip else "no clip"
        rows = {}
        for what, metric in (("train", "train_loss"), ("val", "val_loss")):
            s = summary[what]
            proxy = s["best_lr_grid"][widths[0]]
            reg = lab.regret([r for r in runs if r["size"] == widths[-1]], proxy, grid=lrs, metric=metric)
            rows[what] = {"best_lr": s["best_lr"], "spread_steps": s["spread_steps"], "at_edge": s["at_edge"],
                          "loss_at_best": s["loss_at_best"], "exponent": s["exponent"],
                          "regret": reg["regret"], "regret_steps": reg["regret_steps"], "proxy_lr": proxy}
            best = ", ".join(f"{w}: {s['best_lr'][w]:.3g}" for w in widths)
            print(f"{name:14s} {what:5s}: spread {s['spread_steps']:.2f} steps, best LR {best}, at edge "
                  f"{s['at_edge']}; loss at best (w={widths[-1]}) {s['loss_at_best'][widths[-1]]:.4f}; regret of "
                  f"w={widths[0]}'s LR {proxy:.3g} at w={widths[-1]}: {reg['regret']:.4f} nats "
                  f"({reg['regret_steps']:+.2f} steps)", flush=True)
        clipped = {f"{r['size']}/{r['lr']:.3g}/{r['seed']}": r["clipped_head_steps"] / r["head_steps"] for r in runs}
        runs_clipped = sum(r["clipped_head_steps"] > 0 for r in runs)
        print(f"{name:14s} runs with a head over tau={args.tau:g}: {runs_clipped}/{len(runs)}; fraction of head-steps "
              "over tau per width (all LRs, seeds): " + ", ".join(
                  f"{w}: {np.mean([v for k, v in clipped.items() if k.startswith(f'{w}/')]):.3f}" for w in widths),
              flush=True)
        result[name] = {"summary": rows, "runs": runs, "runs_with_clipped_heads": runs_clipped}
    print(f"width sweep: {time.time() - t0:.0f}s")
    cli.write_json(args.json, {"args": vars(args), "config": cfg, "lrs": lrs, "result": result,
                               "environment": cli.environment()})
    return result


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depth = runs[0]["depth"]
    fig, axes = plt.subplots(1, depth, figsize=(5 * depth, 3.6), squeeze=False)
    for r in runs:
        m = np.asarray(r["max_logit"])
        for layer in range(depth):
            ax = axes[0, layer]
            ax.plot(
                m[:, layer],
                color="C1" if r["clip"] else "C0",
                alpha=0.8,
                lw=1,
                ls="-" if r["seed"] == runs[0]["seed"] else "--",
                label=f"{'qk_clip' if r['clip'] else 'no clip'} seed {r['seed']}",
            )
    for layer in range(depth):
        ax = axes[0, layer]
        ax.axhline(runs[0]["tau"], color="k", lw=0.8, ls=":", label="tau")
        ax.set_title(f"layer {layer}: max |logit| (max over heads)")
        ax.set_xlabel("step")
        ax.set_yscale("log")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Muon lr={runs[0]['lr']} (constant), width {runs[0]['width']}, GPT cpu")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--tau", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--no-clip-only", action="store_true", help="only the unclipped runs (finding the regime)")
    ap.add_argument("--width-sweep", action="store_true",
                    help="gpt_width's quick Muon sweep without and with qk_clip(--tau) (LR transfer, heads clipped)")
    ap.add_argument("--out", default="docs/figures")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.width_sweep:
        return width_sweep(args)
    data = lab.text(context=args.context, sequence=True)
    t0 = time.time()
    by_clip = {
        clip: clip_runs(
            data,
            width=args.width,
            depth=args.depth,
            lr=args.lr,
            tau=args.tau,
            steps=args.steps,
            seeds=list(range(args.seeds)),
            batch_size=args.batch_size,
            clip=clip,
        )
        for clip in ((False,) if args.no_clip_only else (False, True))
    }
    runs = [r for seed in range(args.seeds) for rs in by_clip.values() for r in rs if r["seed"] == seed]
    for r in runs:
        m = np.asarray(r["max_logit"], float)
        print(
            f"seed {r['seed']} clip={r['clip']}: loss {r['final_loss']:.4f}; max logit step 1 {m[0].max():.2f}, "
            f"peak {np.nanmax(m):.2f}, last {m[-1].max():.2f}; end max logit {max(r['end_max_logit']):.2f}, "
            f"bound {max(r['end_bound']):.1f}",
            flush=True,
        )
    print(f"{len(runs)} runs: {time.time() - t0:.0f}s", flush=True)
    if not args.no_clip_only:
        os.makedirs(args.out, exist_ok=True)
        plot(runs, os.path.join(args.out, "qk_clip.png"))
    cli.write_json(args.json, {"args": vars(args), "runs": runs, "environment": cli.environment()})
    return runs


if __name__ == "__main__":
    main()
