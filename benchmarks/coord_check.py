"""One-step coordinate check of the spectral-condition paper.

ReLU MLP ``32 -> n -> n -> 1`` without biases; one SGD step on one example
with loss ``-f`` (so ``dL/df = -1`` at every width); three parametrizations
that coincide exactly at ``n = 64``:

* muP (Parametrization 1): init std ``sqrt(2)/sqrt(d_in) * min(1, sqrt(d_out/d_in))``,
  per-layer LR ``eta * (d_out/d_in)`` relative to n = 64 (input ``eta*n/64``,
  hidden ``eta``, output ``eta*64/n``);
* NTP: standard init (std ``proportional to 1/sqrt(d_in)``), LR ``eta * 64/d_in``
  relative to n = 64 (input ``eta``, hidden and output ``eta*64/n``);
* SP: standard init, one LR ``eta`` for every layer.

Per width (averaged over seeds): the relative feature change ``||dh||/||h||``
of both hidden layers (post-ReLU), the output change ``|df|``, and the
relative change of the hidden weight ``W2`` in spectral and Frobenius norm.
Predicted: muP flat; NTP falls like ``n^-1/2``; SP's output change grows like n.

    python -m benchmarks.coord_check [--quick] [--json PATH] [--out DIR]

References: Yang, Simon, Bernstein (2023), the one-step figure; docs/math.md 2.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import _common
from spectral_optax import diagnostics, lab

PARAMS = ("muP", "NTP", "SP")
METRICS = ("h1", "h2", "out", "W2_spectral", "W2_frobenius")
D0, BASE, GAIN = 32, 64, math.sqrt(2.0)


def layer_scales(n: int):
    """(stds, lrs) per parametrization, each (3 layers,), as multipliers of eta."""
    dims = [(D0, n), (n, n), (n, 1)]
    base_dims = [(D0, BASE), (BASE, BASE), (BASE, 1)]

    def mup_std(a, b):
        return GAIN / math.sqrt(a) * min(1.0, math.sqrt(b / a))

    mup_std_n = [mup_std(a, b) for a, b in dims]
    base_std = [mup_std(a, b) for a, b in base_dims]
    # SP / NTP: the n = 64 muP value, scaled like 1/sqrt(d_in) from there.
    sp_std = [s * math.sqrt(ab / a) for s, (a, _), (ab, _) in zip(base_std, dims, base_dims)]
    mup_lr = [(b / a) / (bb / ab) for (a, b), (ab, bb) in zip(dims, base_dims)]
    ntp_lr = [ab / a for (a, _), (ab, _) in zip(dims, base_dims)]
    sp_lr = [1.0, 1.0, 1.0]
    stds = np.array([mup_std_n, sp_std, sp_std], np.float32)
    lrs = np.array([mup_lr, ntp_lr, sp_lr], np.float32)
    return stds, lrs


def one_step(n: int, seeds, eta: float, power_iters: int = 40):
    stds, lrs = layer_scales(n)

    def run(seed):
        kx, k1, k2, k3 = jax.random.split(jax.random.key(seed), 4)
        x = jax.random.normal(kx, (D0,))
        Z = [jax.random.normal(k1, (D0, n)), jax.random.normal(k2, (n, n)),
             jax.random.normal(k3, (n, 1))]
        # ||W2||_* = std2 * ||Z2||_*: one power iteration per seed serves all three.
        z2_norm = diagnostics.spectral_norm(Z[1], method="power", iters=power_iters)
        out = {m: [] for m in METRICS}
        for std, lr in zip(stds, lrs):  # static loop over parametrizations
            W = [float(s) * z for s, z in zip(std, Z)]

            def forward(W):
                h1 = jax.nn.relu(x @ W[0])
                h2 = jax.nn.relu(h1 @ W[1])
                return h1, h2, (h2 @ W[2])[0]

            g = jax.grad(lambda W: -forward(W)[2])(W)
            W_new = [w - eta * float(lr[i]) * gi for i, (w, gi) in enumerate(zip(W, g))]
            (a1, a2, f0), (b1, b2, f1) = forward(W), forward(W_new)
            dW2 = W_new[1] - W[1]
            out["h1"].append(diagnostics.relative_change(b1, a1))
            out["h2"].append(diagnostics.relative_change(b2, a2))
            out["out"].append(jnp.abs(f1 - f0))
            # dW2 = outer(h1, delta2) is rank one: a few power iterations are exact.
            out["W2_spectral"].append(
                diagnostics.spectral_norm(dW2, method="power", iters=5) / (float(std[1]) * z2_norm))
            out["W2_frobenius"].append(diagnostics.relative_change(W_new[1], W[1]))
        return {m: jnp.stack(v) for m, v in out.items()}

    out = jax.jit(jax.vmap(run))(jnp.asarray(seeds, jnp.uint32))
    return {k: np.asarray(v, float) for k, v in jax.device_get(out).items()}  # (seeds, 3)


def plot(widths, table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"h2": "hidden feature change ||dh2||/||h2||", "out": "output change |df|",
              "W2_spectral": "||dW2||_* / ||W2||_*", "W2_frobenius": "||dW2||_F / ||W2||_F"}
    fig, axes = plt.subplots(1, 4, figsize=(13, 2.9))
    colors = {"muP": "C0", "NTP": "C1", "SP": "C3"}
    for ax, metric in zip(axes, titles):
        for p in PARAMS:
            m, s = np.array(table[p][metric]), np.array(table[p][metric + "_std"])
            ax.errorbar(widths, m, yerr=s, marker="o", ms=3, capsize=2, color=colors[p], label=p)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width n")
        ax.set_title(titles[metric], fontsize=9)
        ax.grid(alpha=0.3, which="both", lw=0.4)
    axes[0].legend(fontsize=8, frameon=False)
    fig.suptitle("one SGD step, loss -f, parametrizations coincide at n = 64", fontsize=9)
    fig.tight_layout()
    lab.savefig(fig, path, dpi=80)
    plt.close(fig)


def main(argv=None):
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--eta", type=float, default=0.1, help="global learning rate at n = 64")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (>= 4)")
    p.add_argument("--max-width", type=int, default=4096)
    args = p.parse_args(argv)
    n_seeds = args.seeds or (4 if args.quick else 16)
    widths = [w for w in (64, 128, 256, 512, 1024, 2048, 4096) if w <= args.max_width]
    seeds = list(range(n_seeds))
    t0 = time.time()
    table = {pp: {m: [] for m in METRICS} | {m + "_std": [] for m in METRICS} for pp in PARAMS}
    for n in widths:
        res = one_step(n, seeds, args.eta)
        for i, pp in enumerate(PARAMS):
            for m in METRICS:
                table[pp][m].append(float(res[m][:, i].mean()))
                table[pp][m + "_std"].append(float(res[m][:, i].std()))
    elapsed = time.time() - t0

    print(f"one-step coordinate check, eta={args.eta}, {n_seeds} seeds, widths {widths}")
    print(f"{'param':5s} {'metric':13s} " + " ".join(f"{w:>9d}" for w in widths) + "   last/first")
    for pp in PARAMS:
        for m in METRICS:
            v = table[pp][m]
            print(f"{pp:5s} {m:13s} " + " ".join(f"{x:9.3g}" for x in v) + f"   {v[-1] / v[0]:8.3g}")
    ratio = {pp: {m: table[pp][m][-1] / table[pp][m][0] for m in METRICS} for pp in PARAMS}
    checks = {
        "muP_h1_ratio_in_[0.8,1.25]": 0.8 <= ratio["muP"]["h1"] <= 1.25,
        "muP_h2_ratio_in_[0.8,1.25]": 0.8 <= ratio["muP"]["h2"] <= 1.25,
        "NTP_h2_fall_factor": 1.0 / ratio["NTP"]["h2"],
        "NTP_h1_fall_factor": 1.0 / ratio["NTP"]["h1"],
        "expected_NTP_fall_factor": math.sqrt(widths[-1] / widths[0]),
        "SP_output_growth": ratio["SP"]["out"],
        "SP_output_growth_gt_20": ratio["SP"]["out"] > 20,
    }
    print(f"targets (n={widths[-1]} vs n={widths[0]}):")
    for k, v in checks.items():
        print(f"  {k}: {v:.3g}" if isinstance(v, float) else f"  {k}: {v}")
    fig = os.path.join(args.out, "coord_check.png")
    plot(widths, table, fig)
    print(f"figure: {fig}   ({elapsed:.1f} s)")
    _common.write_json(args.json, {
        "benchmark": "coord_check", "quick": args.quick, "eta": args.eta, "seeds": n_seeds,
        "widths": widths, "results": table, "ratio_last_first": ratio, "checks": checks,
        "figure": fig, "seconds": elapsed, "environment": _common.environment(),
    })
    return table


if __name__ == "__main__":
    main()
