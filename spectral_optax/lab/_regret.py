"""Regret of a transferred learning rate against the target's own sweep.

``regret = L(lr) - min_grid L`` in nats: the target's loss at the
transferred LR minus the best loss of the target's own LR sweep (losses
averaged over seeds, as in :func:`~spectral_optax.lab.summarize`), and
``regret_steps = log(lr / lr*) / log(grid ratio)``: how many grid steps the
transferred LR lies from the sweep's best LR ``lr*`` (parabola-refined;
positive = too high). A transfer is judged against the naive one (the
proxy's LR unchanged) evaluated the same way.

``L(lr)`` is read from runs recorded *at* ``lr`` (train the target at the
transferred LR: add it to the sweep's LRs and pass the grid separately);
when none were, it is interpolated linearly in ``log(lr)`` between the two
neighbouring grid points and the result says so (``interpolated``).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from spectral_optax.lab._summary import _grid_ratio, refine_minimum

__all__ = ["CONTROL_SUFFIX", "REGRET_TOLERANCE", "regret", "transfer_controls", "transfer_verdict", "widest_regret"]

#: The width studies' verdict threshold: an optimizer *transfers* when the widest model trained at the narrowest
#: model's best LR loses at most this much train loss against the widest model's own best (nats).
REGRET_TOLERANCE = 0.02


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def _mean_by_lr(runs, metric):
    by_lr: dict[float, list[float]] = defaultdict(list)
    for r in runs:
        v = r.get(metric)
        bad = r.get("diverged") or v is None or not np.isfinite(v)
        by_lr[float(r["lr"])].append(np.inf if bad else float(v))
    return {lr: float(np.mean(v)) for lr, v in by_lr.items()}


def regret(
    runs: Sequence[dict],
    lr: float,
    *,
    grid: Sequence[float] | None = None,
    size: int | None = None,
    metric: str = "train_loss",
    reference: str = "grid",
) -> dict:
    """Regret of training the target at ``lr`` instead of its own best LR.

    Args:
      runs: the target's run records (:func:`~spectral_optax.lab.sweep`),
        possibly including runs at ``lr`` itself.
      lr: the transferred learning rate.
      grid: the LRs of the target's own sweep (default: every LR in
        ``runs`` except ``lr``). The best loss and best LR come from these.
      size: keep only runs of this size (default: all runs; they must share
        one size).
      metric: ``'train_loss'`` or ``'val_loss'``.
      reference: the best loss subtracted: ``'grid'`` (the minimum over
        ``grid``; an LR off the grid can then have a negative regret) or
        ``'all'`` (the minimum over every LR in ``runs``, so that several
        transferred LRs evaluated on one target share one reference and every
        regret is ``>= 0``). The best LR is always refined on ``grid``.

    Returns:
      ``{'regret': nats, 'regret_steps': grid steps (signed), 'loss': L(lr),
      'best_loss': the reference (min over the grid, or over all LRs), 'best_lr': refined best LR,
      'best_lr_grid': the grid minimum, 'lr': lr, 'interpolated': bool,
      'per_seed': {seed: regret in nats}}``. A diverged run at ``lr`` gives
      ``regret = inf``.
    """
    if reference not in ("grid", "all"):
        raise ValueError(f"regret: reference must be 'grid' or 'all', got {reference!r}")
    lr = float(lr)
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"regret: lr must be a finite positive number, got {lr!r}")
    if size is not None:
        runs = [r for r in runs if int(r["size"]) == int(size)]
    sizes = {int(r["size"]) for r in runs}
    if len(sizes) > 1:
        raise ValueError(f"regret: runs of several sizes {sorted(sizes)}; pass size=")
    if grid is None:
        grid = sorted({float(r["lr"]) for r in runs if not _same(float(r["lr"]), lr)})
    grid = sorted(float(g) for g in grid)
    if len(grid) < 2:
        raise ValueError("regret: the target's own sweep needs at least 2 grid LRs")

    def evaluate(rs):
        mean = _mean_by_lr(rs, metric)
        on_grid = [next((v for k, v in mean.items() if _same(k, g)), None) for g in grid]
        if any(v is None for v in on_grid):
            missing = [g for g, v in zip(grid, on_grid) if v is None]
            raise ValueError(f"regret: no runs at grid LRs {missing}")
        ys = np.asarray(on_grid, float)
        floor = min(mean.values()) if reference == "all" else float(np.min(ys))
        at = [v for k, v in mean.items() if _same(k, lr)]
        if at:
            return at[0], ys, False, floor
        u, ug = np.log(lr), np.log(grid)
        if not ug[0] <= u <= ug[-1]:
            raise ValueError(f"regret: lr={lr:g} has no runs and lies outside the grid [{grid[0]:g}, {grid[-1]:g}]")
        j = int(np.clip(np.searchsorted(ug, u) - 1, 0, len(grid) - 2))
        w = (u - ug[j]) / (ug[j + 1] - ug[j])
        a, b = ys[j], ys[j + 1]
        loss = a if w == 0 else b if w == 1 else (1 - w) * a + w * b
        return float(loss), ys, True, floor

    loss, ys, interpolated, best = evaluate(runs)
    best_lr, i = refine_minimum(grid, ys)
    ratio = _grid_ratio(grid)
    per_seed = {}
    for seed in sorted({int(r.get("seed", 0)) for r in runs}):
        ls, _, _, floor_s = evaluate([r for r in runs if int(r.get("seed", 0)) == seed])
        per_seed[seed] = float(ls - floor_s)
    return {
        "regret": float(loss - best),
        "regret_steps": float(np.log(lr / best_lr) / np.log(ratio)) if np.isfinite(best_lr) else float("nan"),
        "loss": float(loss),
        "best_loss": best,
        "best_lr": float(best_lr),
        "best_lr_grid": float(grid[i]) if i >= 0 else float("nan"),
        "lr": lr,
        "interpolated": interpolated,
        "per_seed": per_seed,
    }


def widest_regret(results, summaries) -> dict:
    """Per optimizer: the widest model's loss at the LR tuned (best grid LR) on the narrowest, its own best
    and the difference (:func:`spectral_optax.lab.regret`; nats, and grid steps from the widest's best LR).

    Args:
      results: name -> :class:`~spectral_optax.lab.SweepResult` (or anything with ``runs``) over widths.
      summaries: name -> its :func:`~spectral_optax.lab.summarize` (``best_lr``, ``best_lr_grid``).
    """
    out = {}
    for name, res in results.items():
        s = summaries[name]
        ws = sorted(s["best_lr"])
        lr = s["best_lr_grid"][ws[0]]
        if len(ws) < 2 or not lr == lr:  # one width, or every run at the narrowest diverged
            continue
        # The widest width's own sweep is the grid; the transferred LR may be one of its points.
        grid = sorted({float(r["lr"]) for r in res.runs if int(r["size"]) == int(ws[-1])})
        if len(grid) < 2:
            continue
        r = regret(res.runs, lr, size=ws[-1], grid=grid)
        out[name] = {
            "narrow": ws[0],
            "wide": ws[-1],
            **{k: r[k] for k in ("lr", "loss", "best_loss", "regret", "regret_steps")},
            "per_seed": [float(x) for x in r["per_seed"].values()],
        }
    return out


def transfer_verdict(regrets: dict, tolerance: float = REGRET_TOLERANCE) -> dict:
    """Per optimizer: ``'transfers'`` when the regret of the seed-averaged curves is ``<= tolerance``, else
    ``'does not'``, with the margin ``tolerance - regret`` (nats). Each seed's own regret is kept for the
    record, not for the verdict: one seed's curve is noisier than its LR's effect near the best LR.

    Args:
      regrets: name -> a :func:`widest_regret` entry (``regret``, optionally ``per_seed``).
      tolerance: the largest regret (nats) that still counts as a transfer.
    """
    out = {}
    for name, r in regrets.items():
        v = "transfers" if r["regret"] <= tolerance else "does not"
        out[name] = {"verdict": v, "margin": tolerance - r["regret"], "per_seed": r.get("per_seed", [])}
    return out


#: What :func:`transfer_controls` appends to a target's label to name its control.
CONTROL_SUFFIX = ", at the proxy's size"


def transfer_controls(proxy, targets: Mapping, mode: str = "add") -> dict:
    """``targets`` with (``mode='add'``) or replaced by (``'only'``) their controls; ``'off'``: ``targets``.

    A target's control is the target's steps and batch at the proxy's width and depth, labelled
    ``label + CONTROL_SUFFIX``; a target at the proxy's width and depth has none. A transfer recipe
    (:func:`spectral_optax.transfer.transfer`) gives the control the target's LR (width and depth are the
    parametrization's), so the control's regret is the horizon and batch rules' alone, and the target's minus the
    control's is what the width and depth transfer adds.

    Args:
      proxy: the :class:`spectral_optax.transfer.Scale` the LR was tuned at.
      targets: ``{label: Scale}``.
      mode: ``'add'``, ``'only'`` or ``'off'``.

    Returns:
      ``{label: Scale}``: the targets (unless ``'only'``), then the controls in the targets' order.
    """
    if mode not in ("off", "add", "only"):
        raise ValueError(f"controls must be 'off', 'add' or 'only', got {mode!r}")
    if mode == "off":
        return dict(targets)
    out = {} if mode == "only" else dict(targets)
    for label, t in targets.items():
        if (t.width, t.depth) != (proxy.width, proxy.depth):
            out[label + CONTROL_SUFFIX] = dataclasses.replace(t, width=proxy.width, depth=proxy.depth)
    return out
