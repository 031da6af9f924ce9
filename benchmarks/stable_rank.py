"""Stable rank of batch gradients vs batch size (the spectral-condition paper's figure).

The stable rank ``||dW||_F^2 / ||dW||_*^2`` of the hidden weight's gradient
``dW = sum_b h_b delta_b^T`` (a sum of B outer products, one per example),
against the batch size B, for

* a random bias-free ReLU MLP and a random tanh MLP ``d0 -> n -> n -> 10``
  (Gaussian inputs, random labels, softmax cross-entropy; Kaiming /
  LeCun Gaussian init; the gradient of the n x n hidden matrix);
* B independent Gaussian outer products ``sum_b u_b v_b^T`` (no shared
  structure), whose stable rank climbs toward ``n / 4``, that of a square
  Gaussian matrix;
* real data: the same ReLU MLP at width ``--data-width`` on the bundled
  digits (10 classes, 64 pixels) or on CIFAR-10 from a local directory
  (``--data cifar10:DIR``; the paper's setting, width 300).

Network gradients stay near rank one to a few: examples share directions,
so ``||dW||_F`` is within a small factor of ``||dW||_*``, which is what lets
the paper (and ``spectral_sgd``'s Frobenius normalization) treat one for the
other. Mean and standard deviation over seeds.

    python -m benchmarks.stable_rank [--quick] [--json PATH] [--out DIR] [--data digits|cifar10:DIR]

References: Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature
Learning" (the stable-rank figure and its discussion).
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from spectral_optax import diagnostics, lab
from spectral_optax.lab import cli

PAPER = {"relu": 1.03, "tanh": 4.17, "independent": 53.75, "batch": 1024, "width": 256,
         "cifar10_width": 300, "cifar10_max": 10.0}


def _curve_fn(width, kind, classes):
    """A compiled ``(x, y, masks, key) -> stable ranks``, one per 0/1 mask (one batch size each)."""

    def one(x, y, mask, key):
        if kind == "independent":  # u_b v_b^T for the examples in the mask
            g = diagnostics.outer_product_sum(key, width, width, mask.shape[0], example_weights=mask)
        else:
            g = diagnostics.mlp_batch_gradient(x, y, width=width, key=key, activation=kind, num_outputs=classes,
                                               loss="xent", example_weights=mask)
        return diagnostics.stable_rank(g, method="svd")

    return jax.jit(jax.vmap(one, in_axes=(None, None, 0, None)))


def network_curve(kind: str, width: int, batch_sizes, seeds, *, d0: int = 64, classes: int = 10):
    """Stable rank of the hidden gradient per batch size, shape (seeds, len(batch_sizes)).

    Batch size B uses the first B examples of one fixed draw (nested batches); the
    gradients of all batch sizes come from one compiled program (0/1 example masks)."""
    b_max = max(batch_sizes)
    masks = (jnp.arange(b_max)[None, :] < jnp.asarray(batch_sizes)[:, None]).astype(jnp.float32)
    fn = _curve_fn(width, kind, classes)
    out = np.zeros((len(seeds), len(batch_sizes)))
    for i, seed in enumerate(seeds):
        kx, ky, kw = jax.random.split(jax.random.key(seed), 3)
        x = jax.random.normal(kx, (b_max, d0))
        y = jax.random.randint(ky, (b_max,), 0, classes)
        out[i] = np.asarray(fn(x, y, masks, kw))
    return out


def data_curve(data, width: int, batch_sizes, seeds):
    """Same, ReLU MLP on real examples (nested random subsets of the training set)."""
    x_all, y_all = data.train
    batch_sizes = [b for b in batch_sizes if b <= data.num_train]
    b_max = max(batch_sizes)
    masks = (jnp.arange(b_max)[None, :] < jnp.asarray(batch_sizes)[:, None]).astype(jnp.float32)
    fn = _curve_fn(width, "relu", data.num_outputs)
    out = np.zeros((len(seeds), len(batch_sizes)))
    for i, seed in enumerate(seeds):
        idx = np.random.default_rng(seed).permutation(data.num_train)[:b_max]
        out[i] = np.asarray(fn(jnp.asarray(x_all[idx]), jnp.asarray(y_all[idx]), masks, jax.random.key(1000 + seed)))
    return batch_sizes, out


def plot(results, width, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    styles = {"relu": ("C0", "random ReLU MLP"), "tanh": ("C1", "random tanh MLP"),
              "independent": ("C3", "B independent outer products")}
    for name, r in results.items():
        color, label = styles.get(name, ("C2", name.replace("_relu_w", ": ReLU MLP, width ")))
        b, m, s = np.array(r["batch_sizes"]), np.array(r["mean"]), np.array(r["std"])
        ax.plot(b, m, "-o", ms=3, color=color, label=label)
        ax.fill_between(b, np.maximum(m - s, 1e-3), m + s, color=color, alpha=0.2, lw=0)
    ax.axhline(width / 4, color="C3", ls=":", lw=1, label=f"n / 4 = {width / 4:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("stable rank ||dW||_F^2 / ||dW||_*^2")
    ax.set_title(f"hidden-weight gradient, width {width}", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3, which="both", lw=0.4)
    fig.tight_layout()
    lab.savefig(fig, path, dpi=90)
    plt.close(fig)


def main(argv=None):
    p = cli.parser(__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=None, help="hidden width (default 256, the paper's; quick 128)")
    p.add_argument("--batch-sizes", default=None, help="comma list (default 1, 2, 4, ..., 1024; quick to 256)")
    p.add_argument("--seeds", type=int, default=None, help="seeds (default 3, quick 2)")
    p.add_argument("--data", default="digits", help="real data: 'digits', 'cifar10:DIR' or 'none'")
    p.add_argument("--data-width", type=int, default=300, help="width of the real-data MLP (paper: 300)")
    args = p.parse_args(argv)
    width = args.width or (128 if args.quick else 256)
    if args.batch_sizes:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    else:
        batch_sizes = [2**k for k in range(9 if args.quick else 11)]
    seeds = list(range(args.seeds or (2 if args.quick else 3)))
    t0 = time.time()
    results = {}
    for kind in ("relu", "tanh", "independent"):
        r = network_curve(kind, width, batch_sizes, seeds)
        results[kind] = {"batch_sizes": batch_sizes, "mean": r.mean(0).tolist(), "std": r.std(0).tolist(),
                         "per_seed": r.tolist()}
    data_name = None
    if args.data != "none":
        data = lab.load(args.data, flatten=True)
        data_name = data.name
        data_batches = sorted(set(batch_sizes) | ({4096, 10000} if data.num_train >= 10000 else set()))
        b, r = data_curve(data, args.data_width, data_batches, seeds)
        results[f"{data.name}_relu_w{args.data_width}"] = {
            "batch_sizes": b, "mean": r.mean(0).tolist(), "std": r.std(0).tolist(), "per_seed": r.tolist()}
    elapsed = time.time() - t0

    print(f"stable rank of the hidden gradient, width {width}, {len(seeds)} seeds "
          f"(mean +- std over seeds)")
    all_b = sorted({b for r in results.values() for b in r["batch_sizes"]})
    print(f"{'B':>6s} " + " ".join(f"{name:>22s}" for name in results))
    for b in all_b:
        cells = []
        for r in results.values():
            k = r["batch_sizes"].index(b) if b in r["batch_sizes"] else None
            cells.append(f"{r['mean'][k]:10.3g} +- {r['std'][k]:<8.2g}" if k is not None else "")
        print(f"{b:6d} " + " ".join(f"{c:>22s}" for c in cells))
    if 1024 in batch_sizes:
        k = batch_sizes.index(1024)
        print(f"\nat B = 1024 (paper, width {PAPER['width']}): ReLU {results['relu']['mean'][k]:.2f} "
              f"(paper {PAPER['relu']}), tanh {results['tanh']['mean'][k]:.2f} (paper {PAPER['tanh']}), "
              f"independent {results['independent']['mean'][k]:.2f} (paper {PAPER['independent']}); "
              f"n/4 = {width / 4:g}")
    fig = os.path.join(args.out, "stable_rank.png")
    plot(results, width, fig)
    print(f"figure: {fig}   ({elapsed:.1f} s)")
    cli.write_json(args.json, {
        "benchmark": "stable_rank", "quick": args.quick, "width": width, "seeds": len(seeds),
        "data": data_name, "data_width": args.data_width, "results": results, "paper": PAPER,
        "figure": fig, "seconds": elapsed, "environment": cli.environment(),
    })
    return results


if __name__ == "__main__":
    main()
