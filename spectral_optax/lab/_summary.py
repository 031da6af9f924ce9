"""Best learning rate per size and the spread in grid steps (no plotting, no training)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["lr_grid", "refine_minimum", "spread_steps", "summarize"]


# --------------------------------------------------------------------------
def lr_grid(center: float, num: int = 10, ratio: float = 2.0) -> list[float]:
    """``num`` learning rates ``center * ratio**k``, ``k = -(num // 2) .. num - 1 - num // 2``.

    Args:
      center: the LR at ``k = 0`` (the middle of the grid; for even ``num``
        the upper of the two middle points).
      num: number of grid points.
      ratio: factor between neighbouring points (one grid step).

    Returns:
      the increasing list of LRs.
    """
    return [float(center * ratio ** (k - num // 2)) for k in range(num)]


def refine_minimum(lrs: Sequence[float], losses: Sequence[float]) -> tuple[float, int]:
    """Best LR of one loss-vs-LR curve with sub-grid precision.

    Fits a parabola in ``u = log(lr)`` through the grid minimum and its two
    neighbours and returns its vertex (which lies within half a grid step of
    the grid minimum). At the grid edge, or when a neighbour diverged
    (non-finite), returns the grid point.

    Args:
      lrs: increasing, equally log-spaced learning rates.
      losses: the loss at each LR (``inf``/``nan`` = diverged).

    Returns:
      ``(best_lr, index of the grid minimum)``; ``(nan, -1)`` if every run
      diverged.
    """
    lrs_a = np.asarray(lrs, float)
    y = np.asarray(losses, float)
    y = np.where(np.isfinite(y), y, np.inf)
    if not np.isfinite(y).any():
        return float("nan"), -1
    i = int(np.argmin(y))
    if 0 < i < len(y) - 1 and np.isfinite(y[i - 1]) and np.isfinite(y[i + 1]):
        u = np.log(lrs_a)
        h = 0.5 * (u[i + 1] - u[i - 1])
        curv = y[i - 1] - 2 * y[i] + y[i + 1]
        if curv > 0:
            offset = h * (y[i - 1] - y[i + 1]) / (2 * curv)
            return float(np.exp(u[i] + np.clip(offset, -h / 2, h / 2))), i
    return float(lrs_a[i]), i


def spread_steps(best_lrs: Iterable[float], grid_ratio: float = 2.0) -> float:
    """``log2(max / min) / log2(grid_ratio)`` over the finite best LRs (0 for < 2).

    Args:
      best_lrs: best learning rate per size; ``None``, non-finite and
        non-positive entries are skipped.
      grid_ratio: factor between neighbouring grid points, so the result is
        the best LR's movement in grid steps.
    """
    b = np.asarray([x for x in best_lrs if x is not None and np.isfinite(x) and x > 0], float)
    if len(b) < 2:
        return 0.0
    return float(np.log2(b.max() / b.min()) / np.log2(grid_ratio))


def _grid_ratio(lrs: Sequence[float]) -> float:
    grid = np.sort(np.unique(np.asarray(lrs, float)))
    if len(grid) < 2:
        return 2.0
    return float(np.exp(np.median(np.diff(np.log(grid)))))


def summarize(runs: Sequence[dict], *, metric: str = "train_loss", grid_ratio: float | None = None) -> dict:
    """Best LR per size and the spread in grid steps.

    Losses are averaged over seeds per (size, LR); a (size, LR) where any seed
    diverged counts as diverged.

    Args:
      runs: run records (as written by :func:`sweep`).
      metric: ``'train_loss'`` or ``'val_loss'``.
      grid_ratio: ratio between grid points; inferred from the LRs if None.

    Returns:
      ``{"best_lr": {size: lr}, "best_lr_grid": {size: lr},
      "loss_at_best": {size: mean loss at the grid minimum},
      "at_edge": [sizes whose minimum is at the grid edge],
      "diverged": {size: number of diverged runs}, "spread_steps": x,
      "grid_ratio": r, "metric": metric, "num_runs": n}``.
    """
    by_size: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    diverged: dict[int, int] = defaultdict(int)
    for r in runs:
        v = r.get(metric)
        bad = r.get("diverged") or v is None or not np.isfinite(v)
        by_size[r["size"]][float(r["lr"])].append(np.inf if bad or v is None else float(v))
        diverged[r["size"]] += int(bool(bad))
    all_lrs = [lr for d in by_size.values() for lr in d]
    ratio = grid_ratio or _grid_ratio(all_lrs)
    best, best_grid, at_best, edge = {}, {}, {}, []
    for size in sorted(by_size):
        lrs = sorted(by_size[size])
        mean = [float(np.mean(by_size[size][lr])) for lr in lrs]
        lr_star, i = refine_minimum(lrs, mean)
        best[size] = lr_star
        best_grid[size] = float(lrs[i]) if i >= 0 else float("nan")
        at_best[size] = mean[i] if i >= 0 else float("nan")
        if i in (0, len(lrs) - 1):
            edge.append(size)
    return {
        "best_lr": best,
        "best_lr_grid": best_grid,
        "loss_at_best": at_best,
        "at_edge": edge,
        "diverged": {s: diverged[s] for s in sorted(by_size)},
        "spread_steps": spread_steps(best.values(), ratio),
        "grid_ratio": ratio,
        "metric": metric,
        "num_runs": len(runs),
    }


def exponent_summaries(runs, sizes) -> dict:
    """:func:`summarize` of the seed-averaged losses plus the size exponent of the best LR, for train
    (``'train'``) and validation (``'val'``) loss.

    Each summary gains ``exponent`` (the least-squares slope of ``log best LR`` against ``log size``:
    0 when the best LR transfers, -1 when it falls as ``1 / size``), ``exponent_per_seed`` (each seed's
    own), ``exponent_interval`` (their range) and ``best_lr_per_seed``.

    Args:
      runs: run records of :func:`~spectral_optax.lab.sweep` (``size``, ``seed``, ``lr`` and the losses).
      sizes: the sizes to fit over, in order.
    """
    from spectral_optax.lab.cli import loglog_slope

    out = {}
    seeds = sorted({r["seed"] for r in runs})
    for what, metric in (("train", "train_loss"), ("val", "val_loss")):
        s = summarize(runs, metric=metric)
        best = [s["best_lr"].get(w, np.nan) for w in sizes]
        per_seed = {}
        for seed in seeds:
            ss = summarize([r for r in runs if r["seed"] == seed], metric=metric)
            per_seed[seed] = {w: ss["best_lr"].get(w, np.nan) for w in sizes}
        slopes = [loglog_slope(sizes, [per_seed[sd][w] for w in sizes]) for sd in seeds]
        finite = [x for x in slopes if np.isfinite(x)]
        s.update(
            exponent=loglog_slope(sizes, best),
            exponent_per_seed=dict(zip(seeds, slopes)),
            exponent_interval=[min(finite), max(finite)] if finite else [np.nan, np.nan],
            best_lr_per_seed=per_seed,
        )
        out[what] = s
    return out
