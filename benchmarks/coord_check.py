"""One-step coordinate check of the spectral-condition paper.

ReLU MLP ``d0 -> n -> n -> 1`` without biases (``d0 = 32``); one step on one
example ``x ~ N(0, I)`` with loss ``-f`` (``dL/df = -1`` at every width;
``--loss mse``: ``0.5 (f - 1)^2``); rules that coincide exactly at ``n = 64``:

* muP (Parametrization 1): init std ``gain/sqrt(d_in) * min(1, sqrt(d_out/d_in))``,
  per-layer SGD LR ``eta * (d_out/d_in)`` relative to n = 64 (input ``eta*n/64``,
  hidden ``eta``, output ``eta*64/n``);
* NTP: standard init (std ``proportional to 1/sqrt(d_in)``), LR ``eta * 64/d_in``
  relative to n = 64 (input ``eta``, hidden and output ``eta*64/n``);
* SP: standard init, one LR ``eta`` for every layer;
* LARS and LARS-spectral (muP init; ``so.scale_by_spectral_trust_ratio``
  with ``rule='lars'`` / ``'spectral'``): every layer's update is a fixed
  fraction of the weight in Frobenius norm, ``||dW||_F = c_l ||W||_F``
  (LARS), or ``c_l ||W||_F * sqrt(k_l(64) / k_l(n))`` with
  ``k_l = min(d_in, d_out)`` (the corrected rule); ``c_l = c / sqrt(k_l(64))``
  so the two coincide at n = 64 (``--trust-coefficient c``).

Per width (mean and standard deviation over seeds): the relative feature
change ``||dh||/||h||`` of both hidden layers (post-ReLU), the output change
``|df|`` and its parts (read-out update alone ``f(W1, W2, w3') - f``, hidden
updates alone ``f(W1', W2', w3) - f``, and their interaction, the rest), and
the relative change of the hidden weight ``W2`` in spectral and Frobenius
norm. Predicted: muP flat; NTP falls like ``n^-1/2``; SP's output change
grows like n; LARS's hidden spectral change grows like ``sqrt(n)``, the
corrected rule's is flat.

    python -m benchmarks.coord_check [--quick] [--seeds N] [--eta E] [--gain G] [--loss neg_f|mse]
                                     [--json PATH] [--out DIR]

References: Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature
Learning" (the one-step figure; the LARS / LAMB discussion); docs/math.md section 2.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import spectral_optax as so
from spectral_optax import diagnostics, lab
from spectral_optax.lab import cli

SGD_RULES = ("muP", "NTP", "SP")
TRUST_RULES = ("LARS", "LARS-spectral")
RULES = SGD_RULES + TRUST_RULES
METRICS = ("h1", "h2", "out", "out_head", "out_hidden", "out_cross", "W2_spectral", "W2_frobenius")
D0, BASE = 32, 64
NAMES = ("Dense_0", "Dense_1", "head")
# The paper's one-step figure (widths 64 and 4096), as quoted in the issue.
PAPER = {
    "muP": {"h2": (0.128, 0.128), "out": (2.0, 2.0)},
    "NTP": {"h2": (0.128, 0.0161), "out": (2.0, 2.0)},
    "SP": {"h2": (0.128, 0.61), "out": (2.07, 99.9), "W2_frobenius": (0.0092, 0.0093),
           "W2_spectral_growth": 8.1},
}


def layer_scales(n: int, gain: float = math.sqrt(2.0), d0: int = D0):
    """(stds, lrs) per SGD rule, each (3 rules, 3 layers); LRs as multipliers of eta."""
    dims = [(d0, n), (n, n), (n, 1)]
    base_dims = [(d0, BASE), (BASE, BASE), (BASE, 1)]

    def mup_std(a, b):
        return gain / math.sqrt(a) * min(1.0, math.sqrt(b / a))

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


def trust_lrs(c: float, d0: int = D0):
    """Per-layer multipliers ``c / sqrt(min(d_in, d_out))`` at n = 64 (both trust rules coincide there)."""
    return [c / math.sqrt(min(a, b)) for a, b in [(d0, BASE), (BASE, BASE), (BASE, 1)]]


def one_step(n: int, seeds, eta: float, *, gain: float = math.sqrt(2.0), d0: int = D0, loss: str = "neg_f",
             trust_coefficient: float = 0.08, power_iters: int = 40):
    """All metrics for every rule at width n: dict metric -> array (seeds, len(RULES))."""
    stds, lrs = layer_scales(n, gain, d0)
    tr_lr = trust_lrs(trust_coefficient, d0)
    trust = {"LARS": so.scale_by_spectral_trust_ratio(rule="lars"),
             "LARS-spectral": so.scale_by_spectral_trust_ratio(rule="spectral")}

    def forward(W, x):
        h1 = jax.nn.relu(x @ W[0])
        h2 = jax.nn.relu(h1 @ W[1])
        return h1, h2, (h2 @ W[2])[0]

    def loss_fn(W, x):
        f = forward(W, x)[2]
        return -f if loss == "neg_f" else 0.5 * (f - 1.0) ** 2

    def run(seed):
        kx, k1, k2, k3 = jax.random.split(jax.random.key(seed), 4)
        x = jax.random.normal(kx, (d0,))
        Z = [jax.random.normal(k1, (d0, n)), jax.random.normal(k2, (n, n)), jax.random.normal(k3, (n, 1))]
        # ||W2||_* = std2 * ||Z2||_*: one power iteration per seed serves every rule.
        z2_norm = diagnostics.spectral_norm(Z[1], method="power", iters=power_iters)
        out = {m: [] for m in METRICS}
        for rule in RULES:  # static loop
            std = stds[SGD_RULES.index(rule)] if rule in SGD_RULES else stds[0]
            W = [float(s) * z for s, z in zip(std, Z)]
            g = jax.grad(loss_fn)(W, x)
            if rule in SGD_RULES:
                lr = lrs[SGD_RULES.index(rule)]
                dW = [-eta * float(lr[i]) * gi for i, gi in enumerate(g)]
            else:
                tree = lambda ws: {name: {"kernel": w} for name, w in zip(NAMES, ws)}
                u, _ = trust[rule].update(tree(g), optax.EmptyState(), tree(W))
                # LARS: c_l = c / sqrt(k_l(64)) per layer; the corrected rule divides by sqrt(k_l(n))
                # itself, so it gets c: both give c ||W|| / sqrt(k_l(64)) at n = 64.
                mult = tr_lr if rule == "LARS" else [trust_coefficient] * 3
                dW = [-mult[i] * u[name]["kernel"] for i, name in enumerate(NAMES)]
            W1 = [w + d for w, d in zip(W, dW)]
            (a1, a2, f0), (b1, b2, f1) = forward(W, x), forward(W1, x)
            f_head = forward(W[:2] + W1[2:], x)[2]
            f_hidden = forward(W1[:2] + W[2:], x)[2]
            out["h1"].append(diagnostics.relative_change(b1, a1))
            out["h2"].append(diagnostics.relative_change(b2, a2))
            out["out"].append(jnp.abs(f1 - f0))
            out["out_head"].append(f_head - f0)
            out["out_hidden"].append(f_hidden - f0)
            out["out_cross"].append((f1 - f0) - (f_head - f0) - (f_hidden - f0))
            # dW2 is rank one (one example): a few power iterations are exact.
            out["W2_spectral"].append(
                diagnostics.spectral_norm(dW[1], method="power", iters=5) / (float(std[1]) * z2_norm))
            out["W2_frobenius"].append(diagnostics.relative_change(W1[1], W[1]))
        return {m: jnp.stack(v) for m, v in out.items()}

    out = jax.jit(jax.vmap(run))(jnp.asarray(seeds, jnp.uint32))
    return {k: np.asarray(v, float) for k, v in jax.device_get(out).items()}  # (seeds, rules)


def plot(widths, table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"h2": "hidden feature change ||dh2||/||h2||", "out": "output change |df|",
              "W2_spectral": "||dW2||_* / ||W2||_*", "W2_frobenius": "||dW2||_F / ||W2||_F"}
    fig, axes = plt.subplots(1, 5, figsize=(16, 3.0))
    colors = {"muP": "C0", "NTP": "C1", "SP": "C3", "LARS": "C4", "LARS-spectral": "C2"}

    def line(ax, rule, metric, **kw):
        m, s = np.array(table[rule][metric]), np.array(table[rule][metric + "_std"])
        ax.errorbar(widths, m, yerr=s, marker="o", ms=3, capsize=2, color=colors[rule], **kw)

    for ax, metric in zip(axes, titles):
        for rule in SGD_RULES:
            line(ax, rule, metric, label=rule)
        ax.set_title(titles[metric], fontsize=9)
    ax = axes[-1]
    for rule in TRUST_RULES:
        line(ax, rule, "W2_spectral", label=f"{rule}: ||dW2||_*/||W2||_*")
        line(ax, rule, "h2", ls="--", label=f"{rule}: ||dh2||/||h2||")
    ax.set_title("trust-ratio rules (muP init)", fontsize=9)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width n")
        ax.grid(alpha=0.3, which="both", lw=0.4)
        ax.legend(fontsize=6, frameon=False)
    fig.suptitle("one step on one example, loss -f, all rules coincide at n = 64", fontsize=9)
    fig.tight_layout()
    lab.savefig(fig, path, dpi=80)
    plt.close(fig)


def paper_rows(widths, table):
    """(rule, metric, ours first, paper first, ours last, paper last) for every quoted paper value."""
    rows = []
    for rule, vals in PAPER.items():
        for metric, v in vals.items():
            if metric.endswith("_growth"):
                m = metric[: -len("_growth")]
                rows.append((rule, metric, None, None, table[rule][m][-1] / table[rule][m][0], v))
            else:
                rows.append((rule, metric, table[rule][metric][0], v[0], table[rule][metric][-1], v[1]))
    return rows


def main(argv=None):
    p = cli.parser(__doc__.split("\n\n")[0])
    p.add_argument("--eta", type=float, default=0.1, help="global SGD learning rate at n = 64")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default 16, quick 4)")
    p.add_argument("--max-width", type=int, default=4096)
    p.add_argument("--gain", type=float, default=math.sqrt(2.0), help="init gain sigma0 (default sqrt(2))")
    p.add_argument("--d0", type=int, default=D0, help="input dimension")
    p.add_argument("--loss", choices=("neg_f", "mse"), default="neg_f")
    p.add_argument("--trust-coefficient", type=float, default=0.08, help="c of the LARS rows")
    args = p.parse_args(argv)
    n_seeds = args.seeds or (4 if args.quick else 16)
    widths = [w for w in (64, 128, 256, 512, 1024, 2048, 4096) if w <= args.max_width]
    seeds = list(range(n_seeds))
    t0 = time.time()
    table = {r: {m: [] for m in METRICS} | {m + "_std": [] for m in METRICS} for r in RULES}
    per_seed_out = {}
    for n in widths:
        res = one_step(n, seeds, args.eta, gain=args.gain, d0=args.d0, loss=args.loss,
                       trust_coefficient=args.trust_coefficient)
        per_seed_out[n] = res["out"]
        for i, r in enumerate(RULES):
            for m in METRICS:
                table[r][m].append(float(res[m][:, i].mean()))
                table[r][m + "_std"].append(float(res[m][:, i].std()))
    elapsed = time.time() - t0

    print(f"one-step coordinate check: eta={args.eta}, gain={args.gain:.4g}, d0={args.d0}, loss={args.loss}, "
          f"trust coefficient {args.trust_coefficient}, {n_seeds} seeds (mean, and std over seeds)")
    print(f"{'rule':13s} {'metric':12s} " + " ".join(f"{w:>9d}" for w in widths) + "   last/first  std@last")
    for r in RULES:
        for m in METRICS:
            v = table[r][m]
            ratio = v[-1] / v[0] if v[0] != 0 else float("nan")
            print(f"{r:13s} {m:12s} " + " ".join(f"{x:9.3g}" for x in v)
                  + f"   {ratio:9.3g}  {table[r][m + '_std'][-1]:8.2g}")
    ratio = {r: {m: table[r][m][-1] / table[r][m][0] if table[r][m][0] else float("nan") for m in METRICS}
             for r in RULES}
    rows = paper_rows(widths, table)
    print(f"\nbeside the paper (n = {widths[0]} and n = {widths[-1]}):")
    print(f"{'rule':5s} {'quantity':20s} {'ours':>9s} {'paper':>9s}   {'ours':>9s} {'paper':>9s}")
    for rule, metric, o0, p0, o1, p1 in rows:
        a = f"{o0:9.3g} {p0:9.3g}" if o0 is not None else f"{'':9s} {'':9s}"
        print(f"{rule:5s} {metric:20s} {a}   {o1:9.3g} {p1:9.3g}")
    sp = table["SP"]
    print("\nSP output change, decomposed (read-out update alone / hidden updates alone / interaction):")
    for k, n in enumerate(widths):
        print(f"  n={n:5d}: |df| {sp['out'][k]:8.3g} = {sp['out_head'][k]:8.3g} + {sp['out_hidden'][k]:8.3g}"
              f" + {sp['out_cross'][k]:8.3g}")
    # Per seed (same input x at every width), the growth of SP's output change: its spread is the
    # spread of ||h2||^2 at n = 64 (finite width), which dominates the ratio of a single run.
    sp_i = RULES.index("SP")
    growth = per_seed_out[widths[-1]][:, sp_i] / per_seed_out[widths[0]][:, sp_i]
    print(f"SP output growth per seed: mean {growth.mean():.3g}, std {growth.std():.3g}, median "
          f"{np.median(growth):.3g}, min {growth.min():.3g}, max {growth.max():.3g} "
          f"(first-order prediction n_last/n_first = {widths[-1] / widths[0]:g})")
    checks = {
        "SP_output_growth_per_seed": {"mean": growth.mean(), "std": growth.std(), "median": np.median(growth),
                                      "min": growth.min(), "max": growth.max(), "values": growth.tolist()},
        "muP_h1_ratio_in_[0.8,1.25]": 0.8 <= ratio["muP"]["h1"] <= 1.25,
        "muP_h2_ratio_in_[0.8,1.25]": 0.8 <= ratio["muP"]["h2"] <= 1.25,
        "NTP_h2_fall_factor": 1.0 / ratio["NTP"]["h2"],
        "NTP_h1_fall_factor": 1.0 / ratio["NTP"]["h1"],
        "expected_NTP_fall_factor": math.sqrt(widths[-1] / widths[0]),
        "SP_output_growth": ratio["SP"]["out"],
        "SP_output_growth_gt_20": ratio["SP"]["out"] > 20,
        "SP_head_part_growth": ratio["SP"]["out_head"],
        "LARS_W2_spectral_growth": ratio["LARS"]["W2_spectral"],
        "LARS-spectral_W2_spectral_growth": ratio["LARS-spectral"]["W2_spectral"],
        "LARS-spectral_flat_[0.8,1.25]": 0.8 <= ratio["LARS-spectral"]["W2_spectral"] <= 1.25,
    }
    print(f"targets (n={widths[-1]} vs n={widths[0]}):")
    for k, v in checks.items():
        if not isinstance(v, dict):
            print(f"  {k}: {v:.3g}" if isinstance(v, float) else f"  {k}: {v}")
    fig = os.path.join(args.out, "coord_check.png")
    plot(widths, table, fig)
    print(f"figure: {fig}   ({elapsed:.1f} s)")
    cli.write_json(args.json, {
        "benchmark": "coord_check", "quick": args.quick, "eta": args.eta, "gain": args.gain, "d0": args.d0,
        "loss": args.loss, "trust_coefficient": args.trust_coefficient, "seeds": n_seeds, "widths": widths,
        "results": table, "ratio_last_first": ratio, "paper": PAPER,
        "beside_paper": [dict(zip(("rule", "metric", "ours_first", "paper_first", "ours_last", "paper_last"), r))
                         for r in rows],
        "checks": checks, "figure": fig, "seconds": elapsed, "environment": cli.environment(),
    })
    return table


if __name__ == "__main__":
    main()
