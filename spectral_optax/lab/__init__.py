"""The transfer lab: embedded data, vmapped LR sweeps, resumable results, plots.

The tool to see learning-rate transfer with your own eyes: train one model
family at several sizes (widths or depths) over an LR grid and check that the
best LR does not move.

API (all public, used by the benchmarks and reusable for any sweep)::

    import spectral_optax as so
    from spectral_optax import lab

    data = lab.text(context=8)             # embedded pydoc text, next-byte task
    # also: lab.digits(), lab.digits_binary((3, 8)), lab.text(path),
    #       lab.cifar(dir, num_classes=10|100), lab.load('text' | 'cifar10:DIR' ...),
    #       lab.binary_pair('cifar10:DIR', (0, 1), num_train=200): two classes, +-1 targets

    family = lab.mlp_family(data, vary='width', depth=1, init='spectral')
    #   a family is any callable size -> lab.Model(init, apply, loss):
    #     init(key) -> params; apply(params, x) -> outputs;
    #     loss(params, x, y) -> scalar.  lab.Model.from_linen(module, x, 'xent')
    #   wraps any Linen module; mlp_family(..., vary='depth', residual=True,
    #   alpha=lambda K: 2 / K) gives residual MLPs over depth.

    base = family(64).shapes()             # muP base shapes, if the optimizer needs them
    opt = lambda lr, size: so.mup_adamw(lr, base=base)
    #   or one of the registry's named configurations (their LR-grid centres per
    #   experiment, the constants tuned at its proxy):
    #   lab.optimizer('mup_adamw')(lr, base=base), lab.optimizer('muon').grid('gpt_width', 8)
    #   an optimizer factory: (lr, size) -> optax.GradientTransformation (or lr -> ...),
    #   called inside vmap with a traced scalar lr.

    res = lab.sweep(family, opt, sizes=[64, 256, 1024], lrs=lab.lr_grid(1e-2, 10),
                    data=data, steps=300, batch_size=64, seeds=[0, 1],
                    results='results/width.jsonl', name='mup_adamw', size_name='width')
    res.runs        # one dict per run: size, seed, lr, train_loss (mean of the last
                    # 5% of steps), val_loss, diverged, curve, ...
    res.summary()   # {'best_lr': {size: lr}, 'spread_steps': x, 'loss_at_best': {...},
                    #  'best_lr_grid', 'at_edge', 'diverged', 'grid_ratio', ...}
    res.summary('val_loss')  # the same on the held-out loss; res.summaries(): both
    #   lab.sweep(..., schedule='warmup_cosine'): 5% linear warm-up, cosine to 0,
    #   the grid over the peak LR (lab.warmup_cosine(steps) is the multiplier).
    res.plot('width.png')                  # loss vs LR, one curve per size, stars at optima
    lab.plot_sweeps({'mup_adamw': res, ...}, 'all.png')
    lab.regret(res.runs, lr, grid=lrs, size=1024)  # target loss at lr - best of its sweep
                                            # (nats, and grid steps from its best LR)
    lab.quadratic_steps(loss, params, grads, update, lab.route_labels(params))
    #   the step along the update, whole and per route (hidden, head, embedding, vector), that the
    #   loss's quadratic model prefers: the drift diagnosis of benchmarks.gpt_width --diagnose

All LRs x seeds of one size train in one compiled program (vmap over runs,
scan over steps). Every finished run is appended to the JSONL results file;
rerunning the same call skips recorded runs (interrupt-safe). Diverged runs
are recorded with ``diverged: true``.

Spread in grid steps = ``log2(max best LR / min best LR) / log2(grid ratio)``,
with each best LR refined by a parabola fit in log-LR around the grid
minimum (:func:`refine_minimum`). Always read it next to ``loss_at_best``: a
task whose loss reaches its floor over a wide LR band has no well-defined
best LR.

The benchmarks' shared command line, JSON writer and environment record are
:mod:`spectral_optax.lab.cli` (``from spectral_optax.lab import cli``); the depth studies on real
architectures (forms, sweeps, figures, report) are :mod:`spectral_optax.lab.depth`; the tied-embedding study's
model, Theta(1) constants and optimizers are :mod:`spectral_optax.lab.tied`; the pod-scale trees and layouts
are :mod:`spectral_optax.lab.pod`; the whole recipe (tune at a proxy, ``so.transfer``, sweep the target) on a
nanodo-style decoder the package did not write, judged against ``optax.adamw`` on the model's own init, is
:mod:`spectral_optax.lab.third_party`.
"""

from spectral_optax.lab import cli as cli
from spectral_optax.lab import depth as depth
from spectral_optax.lab import pod as pod
from spectral_optax.lab import third_party as third_party
from spectral_optax.lab import tied as tied
from spectral_optax.lab._data import (
    DataError,
    Dataset,
    binary_pair,
    cifar,
    digits,
    digits_augmented,
    digits_binary,
    load,
    text,
)
from spectral_optax.lab._decoder import Decoder
from spectral_optax.lab._models import (
    MLP,
    Model,
    embed_init,
    gpt_family,
    kernel_init,
    loss_for,
    mlp_family,
    resnet_family,
)
from spectral_optax.lab._plots import plot_sweep, plot_sweeps, savefig
from spectral_optax.lab._registry import EXPERIMENTS, OPTIMIZERS, Optimizer, optimizer
from spectral_optax.lab._regret import (
    CONTROL_SUFFIX,
    REGRET_TOLERANCE,
    regret,
    transfer_controls,
    transfer_verdict,
    widest_regret,
)
from spectral_optax.lab._routes import ROUTES, quadratic_steps, route_labels
from spectral_optax.lab._summary import exponent_summaries, lr_grid, refine_minimum, spread_steps, summarize
from spectral_optax.lab._sweep import (
    SweepResult,
    append_run,
    load_runs,
    sweep,
    warmup_cosine,
)

__all__ = [
    "DataError",
    "Dataset",
    "binary_pair",
    "cifar",
    "digits",
    "digits_augmented",
    "digits_binary",
    "load",
    "text",
    "MLP",
    "Decoder",
    "Model",
    "embed_init",
    "gpt_family",
    "kernel_init",
    "loss_for",
    "mlp_family",
    "resnet_family",
    "plot_sweep",
    "plot_sweeps",
    "savefig",
    "EXPERIMENTS",
    "OPTIMIZERS",
    "Optimizer",
    "optimizer",
    "ROUTES",
    "route_labels",
    "quadratic_steps",
    "SweepResult",
    "append_run",
    "load_runs",
    "lr_grid",
    "refine_minimum",
    "regret",
    "REGRET_TOLERANCE",
    "widest_regret",
    "transfer_verdict",
    "transfer_controls",
    "CONTROL_SUFFIX",
    "spread_steps",
    "summarize",
    "exponent_summaries",
    "sweep",
    "warmup_cosine",
]
