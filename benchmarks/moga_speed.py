"""MOGA step speed against optax.adamw on GPT-2-small hidden kernels.

    python -m benchmarks.moga_speed [--quick] [--json PATH] [--reps N]

Tree: the hidden kernels of GPT-2 small (d = 768, 12 blocks of qkv 768x2304,
proj 768x768, fc 768x3072, fc2 3072x768; 85M parameters; ``--quick``: 4
blocks). For ``optax.adamw`` and ``spectral_optax.moga`` at p = 1.5, 2, 2.5
(plus p = 2 with the QKV kernel declared as 3 blocks) it times the jitted
update step: median of ``--reps`` (>= 7) interleaved rounds after warm-up, the
order rotating every round, and reports the ratio to optax.adamw measured in
the same process (target <= 1.5). Only such same-process ratios are
meaningful on a shared machine. Public API only.
"""

from __future__ import annotations

import jax
import optax

import spectral_optax as so
from spectral_optax.lab.cli import environment, hidden_kernel_tree, parser, time_update_steps, write_json

TARGET = 1.5


def optimizers():
    qkv = {r"qkv/kernel$": dict(kind="matrix", fan_out_splits=3)}
    opts = {"optax.adamw": optax.adamw(1e-3)}
    for p in (1.5, 2.0, 2.5):
        opts[f"moga(p={p})"] = so.moga(1e-2, p)
    opts["moga(p=2.0, qkv split)"] = so.moga(1e-2, 2.0, geometry=qkv)
    return opts


def main(argv=None):
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7, help="timed rounds (>= 7 recommended)")
    args = ap.parse_args(argv)
    d, blocks = 768, (4 if args.quick else 12)
    params, grads = hidden_kernel_tree(d, blocks, 0), hidden_kernel_tree(d, blocks, 1)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(f"GPT-2-small hidden kernels: d={d}, {blocks} blocks, {n_params / 1e6:.1f}M parameters", flush=True)
    med, times, _ = time_update_steps(optimizers(), params, grads, args.reps)
    names = list(med)
    ratio = {n: med[n] / med["optax.adamw"] for n in names}
    print(f"\n  {'optimizer':<26} {'median step (s)':>15} {'/ adamw':>8}")
    for n in names:
        print(f"  {n:<26} {med[n]:>15.4f} {ratio[n]:>8.2f}")
    ok = all(r <= TARGET for n, r in ratio.items() if n.startswith("moga"))
    print(f"  target: every moga <= {TARGET}x optax.adamw -> {'met' if ok else 'NOT met'}")
    payload = {
        "command": "python -m benchmarks.moga_speed" + (" --quick" if args.quick else ""),
        "environment": environment(),
        "d": d,
        "blocks": blocks,
        "num_params": int(n_params),
        "reps": args.reps,
        "median_step_s": med,
        "all_step_s": times,
        "ratio_to_adamw": ratio,
        "target": TARGET,
        "target_met": ok,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
