"""The depth studies on real architectures (GPT, ResNet): forms, sweeps, figures, report.

One run = every optimizer variant (``{optimizer}/scaled``: branches
``h + (2/K) f(h)``; ``{optimizer}/unscaled``: ``h + f(h)``; with ``--forms``
also ``{optimizer}/depth_mup``: Depth-muP, ``h + sqrt(2/K) f(h)`` and the block
parameters' learning rate times ``sqrt(2/K)``, ``so.depth_lr_scale``) swept over an LR
grid at every depth with ``spectral_optax.lab.sweep`` (vmapped over the grid,
resumable JSONL, warm-up + cosine schedule over the peak LR, train and
validation loss). The JSON ``summary`` has the schema of
``benchmarks.depth_transfer``: ``"{optimizer}/{form}"`` (train loss) and
``"{optimizer}/{form}/val"`` (validation loss), each with ``best_lr``,
``loss_at_best``, ``spread_steps``, ``at_edge``, ``diverged`` (and the rest of
``lab.summarize``'s keys). The optimizers and their LR-grid centres are the
lab registry's (:data:`spectral_optax.lab.OPTIMIZERS`), for the study's
experiment (``'gpt_depth'``, ``'resnet_depth'``).

Used by ``benchmarks.gpt_depth`` and ``benchmarks.resnet_depth`` (and
``benchmarks.depth_transfer``'s table); public API only.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import optax

import spectral_optax as so
from spectral_optax.lab._plots import plot_sweep, savefig
from spectral_optax.lab._registry import optimizer
from spectral_optax.lab._summary import summarize
from spectral_optax.lab._sweep import SweepResult, sweep
from spectral_optax.lab.cli import SMOKE_NOTE, environment, preset_with_overrides, time_update_steps, write_json

#: every optimizer variant the depth paper compares (default runs pick a subset)
ALL_OPTIMIZERS = ("muon", "moga1.5", "moga2", "moga2.5", "adamw")

#: depth rules: form -> (exponent a of alpha = (2/K)**a, companion LR (2/K)**(1-a) on the blocks?)
FORMS = {"unscaled": (0.0, False), "scaled": (1.0, False), "depth_mup": (0.5, True)}
FORM_LABELS = {"unscaled": "h + f(h)", "scaled": "h + (2/K) f(h)", "depth_mup": "h + sqrt(2/K) f(h), LR*sqrt(2/K)"}


def form_factory(name: str, form: str):
    """``(lr, depth) -> GradientTransformation``: the optimizer with the form's companion learning rate."""
    base = optimizer_factory(name)
    exponent, companion = FORMS[form]
    if not companion:
        return base
    return lambda lr, depth: optax.chain(base(lr), so.depth_lr_scale(depth, exponent=exponent))


def optimizer_factory(name: str):
    """``lr -> GradientTransformation`` for a depth-study optimizer name: the lab registry's configuration
    (defaults of each optimizer, no weight decay)."""
    if name not in ALL_OPTIMIZERS:
        raise SystemExit(f"unknown optimizer {name!r}; have {ALL_OPTIMIZERS}")
    return optimizer(name)


def parser(description: str, presets) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="smoke-test preset (<= 4 minutes on 2 CPU cores)")
    p.add_argument(
        "--preset", choices=sorted(presets), default=None, help="size preset (default: cpu; --quick = quick)"
    )
    p.add_argument("--json", default=None, help="write the results as JSON to this path")
    p.add_argument("--out", default="out", help="directory for figures and the results JSONL")
    p.add_argument("--seeds", type=int, default=1, help="seeds per (depth, LR)")
    p.add_argument("--optimizers", default=None, help=f"comma-separated subset of {','.join(ALL_OPTIMIZERS)}, or 'all'")
    p.add_argument("--depths", default=None, help="comma-separated depths (overrides the preset)")
    p.add_argument("--steps", type=int, default=None, help="training steps (overrides the preset)")
    p.add_argument("--num-lrs", type=int, default=None, help="LR-grid points (overrides the preset)")
    p.add_argument("--width", type=int, default=None, help="width (overrides the preset)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (overrides the preset)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="computation dtype (bfloat16 for accelerators; parameters stay float32)",
    )
    p.add_argument(
        "--forms", default=None, help=f"comma-separated depth rules among {','.join(FORMS)} (default unscaled,scaled)"
    )
    p.add_argument(
        "--extend-edges",
        type=int,
        default=None,
        help="times to add an LR beyond a grid's edge where a depth's best sits there (overrides the preset)",
    )
    p.add_argument(
        "--seed-depths",
        default=None,
        help="DEPTHS:K, e.g. 2,16,128:2: K seeds at those depths, --seeds elsewhere (overrides the preset)",
    )
    p.add_argument("--schedule", choices=("warmup_cosine", "constant"), default="warmup_cosine")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    return p


def config(args, presets) -> tuple[str, dict]:
    preset, cfg = preset_with_overrides(args, presets, ("steps", "num_lrs", "width", "batch_size", "dtype"))
    if args.depths:
        cfg["depths"] = tuple(int(d) for d in args.depths.split(","))
    if args.optimizers:
        cfg["optimizers"] = ALL_OPTIMIZERS if args.optimizers == "all" else tuple(args.optimizers.split(","))
    for name in cfg["optimizers"]:
        optimizer_factory(name)  # fail early on a typo
    if getattr(args, "extend_edges", None) is not None:
        cfg["extend_edges"] = args.extend_edges
    if getattr(args, "seed_depths", None):
        depths, _, k = args.seed_depths.partition(":")
        if not k.isdigit():
            raise SystemExit(f"--seed-depths must be DEPTHS:K (e.g. 2,16,128:2), got {args.seed_depths!r}")
        cfg["seed_depths"] = (tuple(int(d) for d in depths.split(",")), int(k))
    cfg["forms"] = tuple(args.forms.split(",")) if getattr(args, "forms", None) else ("unscaled", "scaled")
    unknown = [f for f in cfg["forms"] if f not in FORMS]
    if unknown:
        raise SystemExit(f"unknown forms {unknown}; have {list(FORMS)}")
    return preset, cfg


def depth_sweep(
    make, factory, grid, *, data, cfg, seeds, results_path, name, progress=False, devices=None, depths=None, **kw
):
    """One :func:`~spectral_optax.lab.sweep` over ``depths`` (default ``cfg['depths']``; ``size_name='depth'``):
    ``grid`` LRs, ``seeds`` seeds (a count), ``cfg['steps']`` steps of ``cfg['batch_size']``, recorded in
    ``results_path`` under ``name``; ``kw``: the rest of ``lab.sweep``'s options (``schedule``, ``tag``,
    ``eval_examples``, ...), its defaults otherwise."""
    return sweep(
        make,
        factory,
        sizes=cfg["depths"] if depths is None else depths,
        lrs=grid,
        data=data,
        steps=cfg["steps"],
        batch_size=cfg["batch_size"],
        seeds=list(range(seeds)),
        results=results_path,
        name=name,
        size_name="depth",
        progress=progress,
        devices=devices,
        **kw,
    )


def run_sweeps(
    *,
    family,
    data,
    cfg,
    experiment,
    results_path,
    seeds,
    tag,
    schedule,
    progress,
    eval_examples=256,
    val_curve=True,
    devices=None,
):
    """Sweep every optimizer x form (``cfg['forms']``, default unscaled and scaled); returns
    (results, summary), printing as it goes.

    ``family(form: str) -> (depth -> lab.Model)``; ``experiment``: the registry's experiment whose LR-grid
    centres the grids are built around. Two optional ``cfg`` keys widen a sweep where it is thin:
    ``seed_depths: (depths, k)`` runs ``k`` seeds (not ``seeds``) at those depths; ``extend_edges: n`` adds, up
    to ``n`` times, one LR a grid step beyond the edge at each depth whose best train or validation loss
    sits at its grid's edge (a best at the edge is a bound, not a minimum), all seeds of that depth.
    Every run goes to ``results_path``, so a rerun resumes, extensions included.
    """
    t0 = time.time()
    results, summary = {}, {}
    extra_depths, extra_seeds = cfg.get("seed_depths") or ((), seeds)
    for name in cfg["optimizers"]:
        grid = optimizer(name).grid(experiment, cfg["num_lrs"])
        ratio = grid[1] / grid[0] if len(grid) > 1 else 2.0
        for form in cfg.get("forms", ("unscaled", "scaled")):
            key = f"{name}/{form}"

            def run(depths, lrs, k, form=form, key=key):
                return depth_sweep(
                    family(form),
                    form_factory(name, form),
                    lrs,
                    data=data,
                    cfg=cfg,
                    seeds=k,
                    results_path=results_path,
                    name=key,
                    progress=progress,
                    devices=devices,
                    depths=depths,
                    tag=tag,
                    schedule=schedule,
                    eval_examples=eval_examples,
                    val_curve=val_curve,
                    chunks=cfg.get("chunks", 5),
                ).runs

            runs = run(cfg["depths"], grid, seeds)
            more = [d for d in cfg["depths"] if d in extra_depths]
            if more and extra_seeds > seeds:
                runs += [r for r in run(more, grid, extra_seeds) if r["seed"] >= seeds]
            for _ in range(cfg.get("extend_edges", 0)):
                beyond = edge_extensions(runs, ratio)
                if not beyond:
                    break
                for depth in sorted({d for d, _ in beyond}):  # one sweep (one compile) per depth
                    k = extra_seeds if depth in extra_depths else seeds
                    runs += run([depth], [lr for d, lr in beyond if d == depth], max(k, seeds))
            res = SweepResult(name=key, runs=runs, size_name="depth", path=results_path)
            results[key] = res
            both = res.summaries()
            summary[key], summary[f"{key}/val"] = both["train"], both["val"]
            for k, s in ((key, both["train"]), (f"{key}/val", both["val"])):
                best = ", ".join(f"K={d}: {v:.3g}" for d, v in s["best_lr"].items())
                print(
                    f"[{time.time() - t0:6.0f}s] {k:22s} spread {s['spread_steps']:.2f} steps; best LR {best}; "
                    f"at edge {s['at_edge']}; diverged {s['diverged']}",
                    flush=True,
                )
    return results, summary


def edge_extensions(runs, ratio: float) -> list[tuple[int, float]]:
    """``[(depth, lr)]``: for each depth whose seed-averaged best train or validation loss is at the lowest
    (highest) LR of its own grid, that LR divided (multiplied) by ``ratio``; none where every run diverged."""
    out = set()
    for metric in ("train_loss", "val_loss"):
        s = summarize(runs, metric=metric, grid_ratio=ratio)
        for depth in s["at_edge"]:
            lrs = sorted({float(r["lr"]) for r in runs if r["size"] == depth})
            best = s["best_lr_grid"][depth]
            if not np.isfinite(best) or len(lrs) < 2:
                continue
            out.add((depth, lrs[0] / ratio if best == lrs[0] else lrs[-1] * ratio))
    return sorted(out)


def throughput(results, units_per_step: int) -> dict:
    """``{variant: {depth: units per second per run}}`` (median over the LR grid; each run's
    share of the vmapped program, compilation excluded)."""
    out = {}
    for key, res in results.items():
        by_depth: dict[int, list[float]] = {}
        for r in res.runs:
            if r.get("step_seconds"):
                by_depth.setdefault(r["size"], []).append(units_per_step / r["step_seconds"])
        out[key] = {d: float(np.median(v)) for d, v in sorted(by_depth.items())}
    return out


def sweep_figures(results, out, prefix, unit_title):
    """Papers' style: one panel per optimizer (columns), one row per form (unscaled, scaled, depth_mup),
    curves per depth, stars at the best LR; one figure for train, one for
    validation loss. Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(k.split("/")[0] for k in results))
    forms = [f for f in FORMS if any(k.split("/")[1] == f for k in results)]
    paths = []
    for metric, label in (("train_loss", "train"), ("val_loss", "val")):
        fig, axes = plt.subplots(
            len(forms), len(names), figsize=(2.9 * len(names) + 0.4, 2.7 * len(forms)), squeeze=False, sharey="row"
        )
        for j, name in enumerate(names):
            for i, form in enumerate(forms):
                res = results.get(f"{name}/{form}")
                if res is None:
                    axes[i, j].set_visible(False)
                    continue
                s = res.summary(metric)
                plot_sweep(
                    res,
                    ax=axes[i, j],
                    metric=metric,
                    title=f"{name}, {FORM_LABELS[form]}\nspread {s['spread_steps']:.2f} steps",
                )
                axes[i, j].title.set_fontsize(8)
                if j:
                    axes[i, j].set_ylabel("")
        _common_ylim(axes, results, metric)
        fig.suptitle(f"{unit_title}: {label} loss vs peak LR (warm-up + cosine)", fontsize=9)
        paths.append(_write(fig, os.path.join(out, f"{prefix}_{label}.png")))
    return paths


def _write(fig, path: str) -> str:
    """Lay out, save and close ``fig``; returns ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    savefig(fig, path)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def _common_ylim(axes, results, metric):
    vals = [
        r[metric] for res in results.values() for r in res.runs if r.get(metric) is not None and np.isfinite(r[metric])
    ]
    if not vals:
        return
    lo = min(vals)
    best = [v for res in results.values() for v in res.summary(metric)["loss_at_best"].values() if np.isfinite(v)]
    hi = max(lo + 0.5, min(max(best) + 0.6, lo + 4.0))
    for row in axes:
        row[0].set_ylim(lo - 0.03 * abs(lo), hi)


def timed_train_steps(family, data, cfg, lrs: dict, depth: int, reps: int = 15) -> dict:
    """Seconds per training step (forward, backward, update; one run, not the vmapped grid) of each
    scaled optimizer at ``depth`` and its LR in ``lrs``, compiled first, then timed interleaved in one
    process (``benchmarks.cli.time_update_steps``): the wall-clock axis of the which-optimizer figure
    rests on ratios measured side by side, not on the sweep's per-run shares taken at different times."""
    import jax

    model = family("scaled")(depth)
    params = model.init(jax.random.key(0))
    x, y = data.numpy_batch("train", np.arange(cfg["batch_size"]))
    fns = {}
    for name, lr in lrs.items():
        tx = optimizer_factory(name)(lr)

        @jax.jit
        def step(params, state, tx=tx):
            loss, grads = jax.value_and_grad(model.loss)(params, x, y)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        state = tx.init(params)
        fns[name] = lambda step=step, state=state: step(params, state)
    median, _, _ = time_update_steps({}, None, None, reps, extra=fns)
    return median


def which_optimizer_figure(results, summary, depth, out, prefix, unit_title, step_seconds=None):
    """Train and validation loss against steps and against wall-clock seconds, every scaled
    optimizer at its best (validation) grid LR at one depth. ``step_seconds[name]``: the seconds per
    step of the time axis (from :func:`timed_train_steps`); default: the sweep's per-run share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(8.0, 5.6))
    colors = plt.get_cmap("tab10")
    rows = {}
    for i, key in enumerate(k for k in results if k.endswith("/scaled")):
        name = key.split("/")[0]
        lr = summary[f"{key}/val"]["best_lr_grid"].get(depth)
        runs = [r for r in results[key].runs if r["size"] == depth and np.isclose(r["lr"], lr or np.nan)]
        if not runs:
            continue
        r = runs[0]
        sec = (step_seconds or {}).get(name, r["step_seconds"])
        steps_t, train = np.asarray(r["curve_steps"]), np.asarray(r["curve"], float)
        steps_v, val = (
            np.asarray(r.get("val_curve_steps", [r["steps"]])),
            np.asarray(r.get("val_curve", [r["val_loss"]]), float),
        )
        kw = {"color": colors(i), "lw": 1.2, "label": f"{name} (lr {lr:.3g}, {1e3 * sec:.1f} ms/step)"}
        axes[0, 0].plot(steps_t, train, **kw)
        axes[0, 1].plot(steps_v, val, marker="o", ms=3, **kw)
        axes[1, 0].plot(steps_t * sec, train, **kw)
        axes[1, 1].plot(steps_v * sec, val, marker="o", ms=3, **kw)
        rows[name] = {
            "lr": lr,
            "step_seconds": sec,
            "sweep_step_seconds": r["step_seconds"],
            "train_loss": r["train_loss"],
            "val_loss": r["val_loss"],
        }
    for ax, (x, y) in zip(
        axes.flat,
        [
            ("step", "train loss"),
            ("step", "val loss"),
            ("seconds (one run, timed interleaved)", "train loss"),
            ("seconds (one run, timed interleaved)", "val loss"),
        ],
    ):
        ax.set_xlabel(x, fontsize=8)
        ax.set_ylabel(y, fontsize=8)
        ax.grid(alpha=0.3, lw=0.4)
        ax.tick_params(labelsize=7)
    finals = [v["val_loss"] for v in rows.values() if v["val_loss"] is not None]
    if finals:
        for ax in axes.flat:
            ax.set_ylim(min(finals) - 0.15, min(finals) + 1.5)
    axes[0, 0].legend(fontsize=6)
    fig.suptitle(f"{unit_title}, depth {depth}, scaled, each optimizer at its best LR", fontsize=9)
    return _write(fig, os.path.join(out, f"{prefix}_which_optimizer.png")), rows


def table(summary, depths, metric_suffix=""):
    """Markdown best-LR table (depth_transfer's format) for train ('') or val ('/val')."""
    sub = {
        k[: -len(metric_suffix)] if metric_suffix else k: v
        for k, v in summary.items()
        if (k.endswith(metric_suffix) if metric_suffix else not k.endswith("/val"))
    }
    return depth_table(sub, depths)


def depth_table(summary, depths) -> str:
    """Markdown table of the best LR per depth (``*`` at the grid's edge) and the spread, one row per
    ``'{optimizer}/{form}'`` key of ``summary``."""
    head = "| optimizer | form | " + " | ".join(f"K={k}" for k in depths) + " | spread (grid steps) |"
    sep = "|" + "---|" * (len(depths) + 3)
    rows = [head, sep]
    for key, s in summary.items():
        name, form = key.split("/")
        cells = []
        for k in depths:
            lr = s["best_lr"].get(k)
            mark = "*" if k in s["at_edge"] else ""
            cells.append("diverged" if lr is None or not np.isfinite(lr) else f"{lr:.3g}{mark}")
        rows.append(f"| {name} | {form} | " + " | ".join(cells) + f" | {s['spread_steps']:.2f} |")
    rows.append("(* = best LR at the edge of the grid)")
    return "\n".join(rows)


def finish(*, benchmark, preset, cfg, data, results, summary, extra, args, t0):
    tables = {"train": table(summary, cfg["depths"]), "val": table(summary, cfg["depths"], "/val")}
    print("train loss:\n" + tables["train"])
    print("validation loss:\n" + tables["val"])
    payload = {
        "benchmark": benchmark,
        "preset": preset,
        "config": dict(cfg, data=data.name, seeds=args.seeds, schedule=args.schedule, base_blocks=2),
        "summary": summary,
        "tables": tables,
        **extra,
        "runs": [r for res in results.values() for r in res.runs],
        "wall_s": time.time() - t0,
        "environment": environment(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    write_json(args.json, payload)
    return payload


def run_and_report(
    *, benchmark, family, data, cfg, preset, args, tag, title, units_per_step, unit, devices=None, writer=True
):
    """The whole depth benchmark after its model family is built: sweeps, figures, throughput, JSON.

    ``benchmark``: its name, also the registry's experiment (LR-grid centres); ``unit``: what
    ``units_per_step`` counts (``'tokens'``, ``'images'``), for the throughput report; ``devices``: the
    sweeps' ``devices=``; ``writer``: whether this process writes figures and the JSON (multi-host: process 0).
    """
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, f"{benchmark}_{preset}.jsonl")
    if preset == "quick":
        print(SMOKE_NOTE.format(benchmark=benchmark, preset="cpu"), flush=True)
    t0 = time.time()
    results, summary = run_sweeps(
        family=family,
        data=data,
        cfg=cfg,
        experiment=benchmark,
        results_path=results_path,
        seeds=args.seeds,
        tag=tag,
        schedule=args.schedule,
        progress=not args.no_progress,
        devices=devices,
    )
    if not writer:
        return summary
    prefix = f"{benchmark}_{preset}"
    figures = sweep_figures(results, args.out, prefix, title)
    deepest = max(cfg["depths"])
    best = {
        key.split("/")[0]: summary[f"{key}/val"]["best_lr_grid"].get(deepest)
        for key in results
        if key.endswith("/scaled")
    }
    print(f"timing one training step per optimizer at depth {deepest} (interleaved):", flush=True)
    step_s = timed_train_steps(family, data, cfg, {k: v for k, v in best.items() if v}, deepest)
    fig, which = which_optimizer_figure(results, summary, deepest, args.out, prefix, title, step_seconds=step_s)
    tput = throughput(results, units_per_step)
    print(f"{unit}/s per run (median over the LR grid):")
    for k, v in tput.items():
        print(f"  {k:18s} " + ", ".join(f"K={d}: {x:,.0f}" for d, x in v.items()))
    return finish(
        benchmark=benchmark,
        preset=preset,
        cfg=cfg,
        data=data,
        results=results,
        summary=summary,
        extra={
            f"throughput_{unit}_per_s": tput,
            "which_optimizer": {"depth": deepest, "runs": which},
            "figures": [*figures, fig],
            "lr_centers": {k: optimizer(k).center(benchmark) for k in cfg["optimizers"]},
        },
        args=args,
        t0=t0,
    )
