"""Figures in the style of the muP / spectral-condition papers.

Loss vs learning rate on a log-x axis, one curve per size (dark = small,
light = large, viridis), a star at each size's best LR; diverged runs are
left out of the curves (and counted in the summary).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from spectral_optax.lab._summary import summarize

__all__ = ["plot_sweep", "plot_sweeps", "savefig"]


def _runs_of(result):
    return result.runs if hasattr(result, "runs") else list(result)


def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        try:
            matplotlib.use("Agg")
        except Exception:  # noqa: BLE001 - an interactive backend already in use
            pass
    import matplotlib.pyplot as plt

    return plt


def savefig(fig, path, dpi: int = 90) -> None:
    """Save ``fig`` to ``path`` (PNG kept small: modest dpi), creating its directory.

    Args:
      fig: a matplotlib figure.
      path: the file to write; the format follows its extension.
      dpi: resolution in dots per inch (cropped to the drawn area).
    """
    import os

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")


def plot_sweep(result, path=None, *, ax=None, metric: str = "train_loss", title=None, size_name: str | None = None):
    """Loss vs LR for one sweep.

    Args:
      result: a :class:`~spectral_optax.lab.SweepResult` or a list of runs.
      path: save the figure there (PNG) when given.
      ax: draw into this matplotlib axis (a new figure otherwise).
      metric: ``'train_loss'`` or ``'val_loss'``.
      title: axis title (default: the sweep name and its spread).
      size_name: legend label for sizes (default from the result).

    Returns:
      the matplotlib axis.
    """
    plt = _pyplot()
    runs = _runs_of(result)
    size_name = size_name or getattr(result, "size_name", "size")
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.2, 3.2))
    summ = summarize(runs, metric=metric) if runs else None
    by: defaultdict = defaultdict(lambda: defaultdict(list))
    for r in runs:
        v = r.get(metric)
        ok = not r.get("diverged") and v is not None and np.isfinite(v)
        by[r["size"]][r["lr"]].append(v if ok else np.inf)
    sizes = sorted(by)
    cmap = plt.get_cmap("viridis")
    finite_best = []
    for k, size in enumerate(sizes):
        color = cmap(k / max(1, len(sizes) - 1) * 0.9)
        lrs = np.array(sorted(by[size]))
        y = np.array([np.mean(by[size][lr]) for lr in lrs])
        ok = np.isfinite(y)
        ax.plot(lrs[ok], y[ok], "-o", ms=2.5, lw=1.2, color=color, label=f"{size}")
        if summ is not None and np.isfinite(summ["best_lr"][size]):
            yb = summ["loss_at_best"][size]
            finite_best.append(yb)
            ax.plot([summ["best_lr"][size]], [yb], "*", ms=10, color=color, mec="k", mew=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("learning rate")
    ax.set_ylabel(metric.replace("_", " "))
    if finite_best:
        all_y = [np.mean(v) for d in by.values() for v in d.values()]
        all_y = [v for v in all_y if np.isfinite(v)]
        lo = min(all_y)
        top = min(max(all_y), max(finite_best) + 2.0 * (max(finite_best) - lo + 0.1))
        ax.set_ylim(lo - 0.05 * (top - lo), top)
    if title is None:
        title = getattr(result, "name", "")
        if summ is not None:
            title += f"  (spread {summ['spread_steps']:.2f} steps)"
    ax.set_title(title, fontsize=9)
    ax.legend(title=size_name, fontsize=6, title_fontsize=7, frameon=False)
    ax.grid(alpha=0.3, which="both", lw=0.4)
    if path is not None and fig is not None:
        savefig(fig, path)
        plt.close(fig)
    return ax


def plot_sweeps(
    results: Mapping[str, object] | Sequence,
    path=None,
    *,
    metric: str = "train_loss",
    ncols: int | None = None,
    suptitle=None,
):
    """One :func:`plot_sweep` panel per sweep, side by side; saved to ``path``.

    Args:
      results: ``{name: SweepResult or runs}`` or a list of SweepResults
        (each panel titled by its name and spread in grid steps).
      path: save the figure there (PNG) when given (the figure is then
        closed).
      metric: ``'train_loss'`` or ``'val_loss'``, for every panel.
      ncols: panels per row (default ``min(len(results), 3)``).
      suptitle: a title over all panels (none by default).

    Returns:
      the matplotlib figure.
    """
    plt = _pyplot()
    if not isinstance(results, Mapping):
        results = {r.name: r for r in results}
    n = len(results)
    ncols = ncols or min(n, 3)
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows), squeeze=False)
    for ax, (name, res) in zip(axes.flat, results.items()):
        summ = None
        runs = _runs_of(res)
        if runs:
            summ = summarize(runs, metric=metric)
        t = f"{name}" + (f"  (spread {summ['spread_steps']:.2f})" if summ else "")
        plot_sweep(res, ax=ax, metric=metric, title=t)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    if path is not None:
        savefig(fig, path)
        plt.close(fig)
    return fig
