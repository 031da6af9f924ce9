"""Feature learning vs width: the training experiment of the spectral-condition paper.

Bias-free ReLU MLP ``d0 -> n -> n -> 1`` trained full batch on a binary task
(+-1 targets, loss ``0.5 (f - y)^2``) with global LR 0.1, under muP
(Parametrization 1: std ``sqrt(2)/sqrt(d_in) * min(1, sqrt(d_out/d_in))``,
LR ``0.1 * d_out/d_in``) and NTP (standard init, LR ``proportional to
1/d_in``), the two coinciding exactly at width 1. Data: 200 bundled digits,
3 vs 8 (``d0 = 64``), or, with ``--data cifar10:DIR``, CIFAR-10 airplane vs
automobile (``d0 = 3072``, the paper's pair) read from the binary batch files
in DIR. After training, relative to init:

1. relative change of the layer-2 preactivations ``||dz2|| / ||z2||``;
2. ``||dW2||_* / ||W2||_*`` (spectral);
3. ``||dW2||_F / ||W2||_F`` (Frobenius);
4. final-layer alignment ``|f| / (||w_out|| ||h2||)``.

Log-log slopes over widths >= 64 are fitted per seed and reported as mean and
standard deviation over seeds, next to the final training losses.
Predicted: muP feature and spectral change flat (slope 0), NTP slope -1/2;
Frobenius change slope -1/2 (muP) and -1 (NTP).

    python -m benchmarks.feature_learning [--quick] [--wide] [--seeds N] [--steps N]
                                          [--data digits|cifar10:DIR] [--json PATH] [--out DIR]

References: Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature
Learning", section 6; docs/math.md section 2.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from spectral_optax import diagnostics, lab
from spectral_optax.lab import cli

PARAMS = ("muP", "NTP")
METRICS = ("feature_change", "W2_spectral_change", "W2_frobenius_change", "alignment")
GAIN, ETA = math.sqrt(2.0), 0.1


def scales(n: int, d0: int):
    """(stds, lrs), each (2 parametrizations, 3 layers); LRs as multipliers of eta."""
    dims = [(d0, n), (n, n), (n, 1)]
    dims1 = [(d0, 1), (1, 1), (1, 1)]
    mup_std = lambda a, b: GAIN / math.sqrt(a) * min(1.0, math.sqrt(b / a))
    std_mup = [mup_std(a, b) for a, b in dims]
    std_ntp = [mup_std(a1, b1) * math.sqrt(a1 / a) for (a, _), (a1, b1) in zip(dims, dims1)]
    lr_mup = [b / a for a, b in dims]
    lr_ntp = [(b1 / a1) * (a1 / a) for (a, _), (a1, b1) in zip(dims, dims1)]
    return np.array([std_mup, std_ntp], np.float32), np.array([lr_mup, lr_ntp], np.float32)


def train_width(n, x, y, steps, seeds, eta=ETA, log_every=100):
    d0 = x.shape[1]
    stds, lrs = scales(n, d0)

    def forward(W):
        z2 = jax.nn.relu(x @ W[0]) @ W[1]
        h2 = jax.nn.relu(z2)
        return z2, h2, (h2 @ W[2])[:, 0]

    def loss_fn(W):
        return 0.5 * jnp.mean((forward(W)[2] - y) ** 2)

    def run(seed, std, lr):
        ks = jax.random.split(jax.random.key(seed), 3)
        shapes = [(d0, n), (n, n), (n, 1)]
        W0 = [std[i] * jax.random.normal(ks[i], shapes[i]) for i in range(3)]

        def step(W, _):
            loss, g = jax.value_and_grad(loss_fn)(W)
            return [w - eta * lr[i] * gi for i, (w, gi) in enumerate(zip(W, g))], loss

        W, losses = jax.lax.scan(step, W0, None, length=steps)
        z0, _, _ = forward(W0)
        z1, h1, f1 = forward(W)
        return {
            "feature_change": diagnostics.relative_change(z1, z0),
            "W2_spectral_change": diagnostics.relative_weight_change(W[1], W0[1], norm="spectral",
                                                                     method="power"),
            "W2_frobenius_change": diagnostics.relative_weight_change(W[1], W0[1],
                                                                      norm="frobenius"),
            "alignment": diagnostics.alignment(f1, W[2], h1),
            "final_loss": jnp.mean(losses[-max(1, steps // 20):]),
            "curve": losses.reshape(-1, log_every).mean(1) if steps % log_every == 0
            else losses[::max(1, steps // 100)],
        }

    per_param = jax.vmap(run, in_axes=(None, 0, 0))
    fn = jax.jit(jax.vmap(per_param, in_axes=(0, None, None)))
    out = fn(jnp.asarray(seeds, jnp.uint32), jnp.asarray(stds), jnp.asarray(lrs))
    return {k: np.asarray(v, float) for k, v in jax.device_get(out).items()}  # (seeds, 2, ...)


def plot(widths, table, curves, path, steps):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"feature_change": "||dz2|| / ||z2||", "W2_spectral_change": "||dW2||_* / ||W2||_*",
              "W2_frobenius_change": "||dW2||_F / ||W2||_F",
              "alignment": "alignment |f| / (||w_out|| ||h||)"}
    fig, axes = plt.subplots(1, 5, figsize=(16, 3.0))
    colors = {"muP": "C0", "NTP": "C1"}
    for ax, metric in zip(axes, titles):
        for p in PARAMS:
            ax.plot(widths, table[p][metric], "-o", ms=3, color=colors[p],
                    label=f"{p} (slope {table[p]['slopes'][metric]:+.2f})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width n")
        ax.set_title(titles[metric], fontsize=9)
        ax.legend(fontsize=7, frameon=False)
        ax.grid(alpha=0.3, which="both", lw=0.4)
    ax = axes[-1]
    cmap = plt.get_cmap("viridis")
    for k, n in enumerate(widths):
        c = cmap(k / max(1, len(widths) - 1) * 0.9)
        for p, ls in (("muP", "-"), ("NTP", "--")):
            y = np.asarray(curves[p][k])
            x = (np.arange(len(y)) + 1) * steps / len(y)
            ax.plot(x, y, ls, color=c, lw=1, label=f"n={n}" if p == "muP" else None)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_title("train loss (solid muP, dashed NTP)", fontsize=9)
    ax.legend(fontsize=5, frameon=False, ncol=2)
    fig.tight_layout()
    lab.savefig(fig, path, dpi=75)
    plt.close(fig)


def main(argv=None):
    p = cli.parser(__doc__.split("\n\n")[0])
    p.add_argument("--wide", action="store_true", help="add widths 2048 and 4096")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 1e4, quick 1e3)")
    p.add_argument("--max-width", type=int, default=None)
    p.add_argument("--widths", default=None, help="comma list of widths (overrides the presets)")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--data", default="digits", help="'digits' or 'cifar10:DIR' (binary batch files)")
    p.add_argument("--classes", default=None, help="two classes (default 3,8 for digits, 0,1 = airplane, "
                   "automobile for CIFAR-10)")
    p.add_argument("--num-train", type=int, default=200, help="training examples (full batch)")
    args = p.parse_args(argv)
    steps = args.steps or (1000 if args.quick else 10000)
    widths = [16, 32, 64, 128, 256, 512, 1024] + ([2048, 4096] if args.wide else [])
    if args.widths:
        widths = [int(w) for w in args.widths.split(",")]
    max_w = args.max_width or (512 if args.quick else None)
    if max_w:
        widths = [w for w in widths if w <= max_w]
    classes = tuple(int(c) for c in (args.classes or ("3,8" if args.data == "digits" else "0,1")).split(","))
    pair = lab.binary_pair(args.data, classes, num_train=args.num_train)
    (x, y), data_name = pair.train, pair.name
    x, y = jnp.asarray(x), jnp.asarray(y)
    seeds = list(range(args.seeds))
    log_every = 100 if steps % 100 == 0 else 1
    t0 = time.time()
    raw = {}
    for n in widths:
        t = time.time()
        raw[n] = train_width(n, x, y, steps, seeds, log_every=log_every)
        print(f"  width {n:5d}: {time.time() - t:6.1f} s, final loss muP "
              f"{raw[n]['final_loss'][:, 0].mean():.4g}, NTP {raw[n]['final_loss'][:, 1].mean():.4g}",
              flush=True)
    elapsed = time.time() - t0
    table, curves = {}, {}
    fit_w = [w for w in widths if w >= 64]
    for i, pp in enumerate(PARAMS):
        table[pp] = {m: [float(raw[n][m][:, i].mean()) for n in widths]
                     for m in METRICS + ("final_loss",)}
        table[pp]["slopes"] = {
            m: cli.loglog_slope(fit_w, [table[pp][m][widths.index(w)] for w in fit_w])
            for m in METRICS + ("final_loss",)
        }
        # One slope per seed: their spread is the seed spread of the slope.
        per_seed = {m: [cli.loglog_slope(fit_w, [raw[w][m][k, i] for w in fit_w]) for k in range(len(seeds))]
                    for m in METRICS + ("final_loss",)}
        table[pp]["slopes_per_seed"] = per_seed
        table[pp]["slope_std"] = {m: float(np.std(v)) for m, v in per_seed.items()}
        table[pp]["std"] = {m: [float(raw[n][m][:, i].std()) for n in widths] for m in METRICS + ("final_loss",)}
        curves[pp] = [raw[n]["curve"][:, i].mean(0).tolist() for n in widths]

    print(f"\nfeature learning: {data_name} ({classes[0]} vs {classes[1]}), {args.num_train} examples, "
          f"d0={x.shape[1]}, full batch, LR {ETA}, {steps} steps, {len(seeds)} seed(s); slopes fitted over "
          f"widths {fit_w} (slope of the seed mean; mean +- std of the per-seed slopes)")
    print(f"{'param':5s} {'metric':20s} " + " ".join(f"{w:>8d}" for w in widths) + "    slope   per-seed")
    for pp in PARAMS:
        for m in METRICS + ("final_loss",):
            v = table[pp][m]
            ps = np.array(table[pp]["slopes_per_seed"][m])
            print(f"{pp:5s} {m:20s} " + " ".join(f"{x:8.3g}" for x in v)
                  + f"   {table[pp]['slopes'][m]:+.3f}   {ps.mean():+.3f} +- {ps.std():.3f}")
    s = {pp: table[pp]["slopes"] for pp in PARAMS}
    checks = {
        "muP_feature_slope_in_[-0.15,0.15]": abs(s["muP"]["feature_change"]) <= 0.15,
        "muP_spectral_slope_in_[-0.15,0.15]": abs(s["muP"]["W2_spectral_change"]) <= 0.15,
        "NTP_feature_slope_in_[-0.6,-0.4]": -0.6 <= s["NTP"]["feature_change"] <= -0.4,
        "NTP_spectral_slope_in_[-0.6,-0.4]": -0.6 <= s["NTP"]["W2_spectral_change"] <= -0.4,
    }
    print("targets:", checks)
    fig = os.path.join(args.out, "feature_learning.png")
    plot(widths, table, curves, fig, steps)
    print(f"figure: {fig}   ({elapsed:.1f} s)")
    cli.write_json(args.json, {
        "benchmark": "feature_learning", "quick": args.quick, "steps": steps, "lr": ETA, "data": data_name,
        "num_train": args.num_train, "d0": int(x.shape[1]), "classes": classes, "seeds": len(seeds),
        "widths": widths, "fit_widths": fit_w,
        "results": table, "curves": curves, "checks": checks, "figure": fig,
        "seconds": elapsed, "environment": cli.environment(),
    })
    return table


if __name__ == "__main__":
    main()
