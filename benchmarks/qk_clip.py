"""QK-clip on the GPT: does Muon's max attention logit grow, and does ``so.qk_clip`` hold it at tau?

The package's decoder (``spectral_optax.nn.linen.Transformer``, fused QKV, Parametrization-1
init as in ``benchmarks.gpt_width``) with ``record_max_logits=True`` on byte-level next-byte
prediction over the embedded text, trained by ``so.muon`` at a constant (high) learning rate,
without and with ``so.qk_clip(tau)`` chained after it. Every step records the per-layer max
logit (max over heads) of the batch; at the end, the weight-only bound
``so.diagnostics.qk_logit_bound`` (inputs of RMS 1) next to the last step's real max logit.

    python -m benchmarks.qk_clip [--lr 0.2] [--tau 20] [--steps 400] [--width 64] [--depth 2]
        [--seeds 2] [--context 64] [--batch-size 8] [--out DIR] [--json PATH]

Outputs in OUT: ``qk_clip.png`` (max logit per layer over steps, clipped and unclipped) and,
with ``--json``, every run's curves and final losses.

``--width-sweep`` instead runs ``benchmarks.gpt_width``'s Muon sweep (its ``quick`` preset:
widths 32, 64, 128, depth 2, context 32, batch 8, 80 steps, Muon's factor-2 grid of 5 peak
LRs around 0.064, 5% warm-up + cosine, 2 seeds, the same init and batches as ``lab.sweep``)
twice, without and with ``so.qk_clip(tau)``, in its own loop: ``lab.sweep`` gives the
optimizer no logits and scales the updates by the schedule *after* the optimizer, which
would undo the clip, so here the schedule sits before it,
``chain(so.muon(lr), scale_by_schedule(m), so.qk_clip(tau))``. Reported per condition: the
best LR per width, its spread in grid steps, the regret (nats and grid steps) at the widest
width of the narrowest width's best grid LR (``lab.regret``), and how many heads the clip
scaled (head-steps with ``S^h > tau``).

    python -m benchmarks.qk_clip --width-sweep [--tau 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import spectral_optax as so
from spectral_optax import lab


def run(data, *, width, depth, lr, tau, steps, seed, context, batch_size, clip):
    model = so.nn.linen.Transformer(
        vocab_size=data.num_outputs,
        features=width,
        num_blocks=depth,
        num_heads=max(1, width // 16),
        max_len=context,
        qkv="fused",
        record_max_logits=True,
        kernel_init=lab.kernel_init("spectral", gain=1.0),
        embedding_init=lab.embed_init("spectral"),
    )
    x0, _ = data.numpy_batch("train", np.zeros((batch_size,), np.int64))
    params = model.init(jax.random.key(seed), jnp.asarray(x0))["params"]
    geometry = so.GeometryMap.from_linen(model, jnp.asarray(x0))
    opt = so.muon(lr, geometry=geometry)
    if clip:
        opt = optax.chain(opt, so.qk_clip(tau, geometry=geometry))
    state = opt.init(params)

    def loss_fn(p, x, y):
        logits, inter = model.apply({"params": p}, x, mutable=["intermediates"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, so.collect_max_logits(inter)

    @jax.jit
    def step(p, s, x, y):
        (loss, ml), g = jax.value_and_grad(loss_fn, has_aux=True)(p, x, y)
        u, s = opt.update(g, s, p, max_logits=ml)
        return optax.apply_updates(p, u), s, loss, ml["blocks/attn"].max(axis=-1)

    rng = np.random.default_rng(seed)
    losses, maxlog = [], []
    for _ in range(steps):
        x, y = data.numpy_batch("train", rng.integers(0, data.num_train, batch_size))
        params, state, loss, ml = step(params, state, jnp.asarray(x), jnp.asarray(y))
        losses.append(float(loss))
        maxlog.append(np.asarray(ml).tolist())
    # Real max logit of the final params on a fixed batch, and the weight-only bound.
    xb, yb = data.numpy_batch("train", np.arange(batch_size) * (data.num_train // batch_size))
    _, ml_end = jax.jit(loss_fn)(params, jnp.asarray(xb), jnp.asarray(yb))
    bound = so.diagnostics.qk_logit_bound(params, geometry, num_heads=max(1, width // 16))["blocks/attn"]
    tail = max(1, steps // 20)
    return {
        "clip": clip,
        "seed": seed,
        "lr": lr,
        "tau": tau,
        "width": width,
        "depth": depth,
        "steps": steps,
        "loss": losses,
        "max_logit": maxlog,
        "final_loss": float(np.mean(losses[-tail:])),
        "end_max_logit": np.asarray(ml_end["blocks/attn"]).max(-1).tolist(),
        "end_bound": np.asarray(bound).max(-1).tolist(),
    }


def width_sweep_runs(data, cfg, *, lrs, tau, clip):
    """Run records (``lab.sweep``'s fields ``size, seed, lr, train_loss, val_loss, diverged``, plus
    ``clipped_head_steps``, ``head_steps``, ``peak_max_logit``) of Muon on ``gpt_width``'s GPT family,
    every (width, LR, seed) of the grid, without (``clip=False``) or with ``so.qk_clip(tau)``."""
    steps, batch = cfg["steps"], cfg["batch_size"]
    multiplier = lab.warmup_cosine(steps)
    train = tuple(jnp.asarray(a) for a in data.train)
    val = tuple(jnp.asarray(a) for a in data.val)
    eval_idx = jnp.asarray(np.linspace(0, data.num_val - 1, min(256, data.num_val)).round().astype(np.int32))
    example_x = jnp.asarray(data.numpy_batch("train", [0])[0])
    tail = max(1, int(np.ceil(0.05 * steps)))
    runs = []
    for width in cfg["widths"]:
        model = so.nn.linen.Transformer(  # lab.gpt_family(data, vary="width", depth=2, init="spectral")(width)
            vocab_size=data.num_outputs,
            features=width,
            num_blocks=cfg["depth"],
            num_heads=max(1, width // 16),
            max_len=data.context,
            base_blocks=2,
            qkv="fused",
            record_max_logits=True,
            kernel_init=lab.kernel_init("spectral", gain=1.0),
            embedding_init=lab.embed_init("spectral"),
        )
        geometry = so.GeometryMap.from_linen(model, example_x)

        def make_opt(lr, geometry=geometry):
            opt = optax.chain(so.muon(lr), optax.scale_by_schedule(multiplier))  # gpt_width's so.muon(lr)
            return optax.chain(opt, so.qk_clip(tau, geometry=geometry)) if clip else opt

        def loss_fn(p, x, y, model=model):
            logits, inter = model.apply({"params": p}, x, mutable=["intermediates"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()
            return loss, so.collect_max_logits(inter)["blocks/attn"]

        def one_run(lr, seed, model=model, make_opt=make_opt, loss_fn=loss_fn):
            k_init, k_data = jax.random.split(jax.random.key(seed))
            params = model.init(k_init, example_x)["params"]
            opt = make_opt(lr)

            def step(carry, t):
                p, s = carry
                idx = jax.random.randint(jax.random.fold_in(k_data, t), (batch,), 0, data.num_train)
                x, y = data.batch(train, idx)
                (loss, ml), g = jax.value_and_grad(loss_fn, has_aux=True)(p, x, y)
                u, s = opt.update(g, s, p, max_logits={"blocks/attn": ml})
                return (optax.apply_updates(p, u), s), (loss, jnp.sum(ml > tau), jnp.max(ml))

            (params, _), (losses, clipped, peak) = jax.lax.scan(step, (params, opt.init(params)), jnp.arange(steps))
            x, y = data.batch(val, eval_idx)
            return losses, clipped, peak, loss_fn(params, x, y)[0]

        grid = [(lr, seed) for seed in range(cfg["seeds"]) for lr in lrs]
        t0 = time.time()
        out = jax.jit(jax.vmap(one_run))(
            jnp.asarray([g[0] for g in grid], jnp.float32), jnp.asarray([g[1] for g in grid], jnp.uint32)
        )
        losses, clipped, peak, val_loss = (np.asarray(a) for a in out)
        heads = cfg["depth"] * max(1, width // 16)
        for j, (lr, seed) in enumerate(grid):
            tr, va = float(np.mean(losses[j, -tail:])), float(val_loss[j])
            runs.append({
                "size": width, "seed": seed, "lr": lr, "train_loss": tr, "val_loss": va,
                "diverged": not (np.isfinite(tr) and np.isfinite(va)),
                "clipped_head_steps": int(clipped[j].sum()), "head_steps": steps * heads,
                "peak_max_logit": float(np.max(peak[j])),
            })
        print(f"  clip={clip} width {width}: {len(grid)} runs, {time.time() - t0:.0f}s", flush=True)
    return runs


def width_sweep(args):
    """``--width-sweep``: see the module docstring."""
    from benchmarks.gpt_width import CENTERS, PRESETS, analyse

    cfg = dict(PRESETS["quick"])
    data = lab.load("text", context=cfg["context"], sequence=True)
    widths = list(cfg["widths"])
    lrs = lab.lr_grid(CENTERS["muon"], cfg["num_lrs"])
    t0 = time.time()
    result = {}
    for clip in (False, True):
        runs = width_sweep_runs(data, cfg, lrs=lrs, tau=args.tau, clip=clip)
        summary = analyse(runs, widths)
        name = f"qk_clip({args.tau:g})" if clip else "no clip"
        rows = {}
        for what, metric in (("train", "train_loss"), ("val", "val_loss")):
            s = summary[what]
            proxy = s["best_lr_grid"][widths[0]]
            reg = lab.regret([r for r in runs if r["size"] == widths[-1]], proxy, grid=lrs, metric=metric)
            rows[what] = {"best_lr": s["best_lr"], "spread_steps": s["spread_steps"], "at_edge": s["at_edge"],
                          "loss_at_best": s["loss_at_best"], "exponent": s["exponent"],
                          "regret": reg["regret"], "regret_steps": reg["regret_steps"], "proxy_lr": proxy}
            best = ", ".join(f"{w}: {s['best_lr'][w]:.3g}" for w in widths)
            print(f"{name:14s} {what:5s}: spread {s['spread_steps']:.2f} steps, best LR {best}, at edge "
                  f"{s['at_edge']}; loss at best (w={widths[-1]}) {s['loss_at_best'][widths[-1]]:.4f}; regret of "
                  f"w={widths[0]}'s LR {proxy:.3g} at w={widths[-1]}: {reg['regret']:.4f} nats "
                  f"({reg['regret_steps']:+.2f} steps)", flush=True)
        clipped = {f"{r['size']}/{r['lr']:.3g}/{r['seed']}": r["clipped_head_steps"] / r["head_steps"] for r in runs}
        runs_clipped = sum(r["clipped_head_steps"] > 0 for r in runs)
        print(f"{name:14s} runs with a head over tau={args.tau:g}: {runs_clipped}/{len(runs)}; fraction of head-steps "
              "over tau per width (all LRs, seeds): " + ", ".join(
                  f"{w}: {np.mean([v for k, v in clipped.items() if k.startswith(f'{w}/')]):.3f}" for w in widths),
              flush=True)
        result[name] = {"summary": rows, "runs": runs, "runs_with_clipped_heads": runs_clipped}
    print(f"width sweep: {time.time() - t0:.0f}s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "config": cfg, "lrs": lrs, "result": result}, f, default=str)


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depth = runs[0]["depth"]
    fig, axes = plt.subplots(1, depth, figsize=(5 * depth, 3.6), squeeze=False)
    for r in runs:
        m = np.asarray(r["max_logit"])
        for layer in range(depth):
            ax = axes[0, layer]
            ax.plot(
                m[:, layer],
                color="C1" if r["clip"] else "C0",
                alpha=0.8,
                lw=1,
                ls="-" if r["seed"] == runs[0]["seed"] else "--",
                label=f"{'qk_clip' if r['clip'] else 'no clip'} seed {r['seed']}",
            )
    for layer in range(depth):
        ax = axes[0, layer]
        ax.axhline(runs[0]["tau"], color="k", lw=0.8, ls=":", label="tau")
        ax.set_title(f"layer {layer}: max |logit| (max over heads)")
        ax.set_xlabel("step")
        ax.set_yscale("log")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Muon lr={runs[0]['lr']} (constant), width {runs[0]['width']}, GPT cpu")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--tau", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--no-clip-only", action="store_true", help="only the unclipped runs (finding the regime)")
    ap.add_argument("--width-sweep", action="store_true",
                    help="gpt_width's quick Muon sweep without and with qk_clip(--tau) (LR transfer, heads clipped)")
    ap.add_argument("--out", default="docs/figures")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.width_sweep:
        return width_sweep(args)
    data = lab.text(context=args.context, sequence=True)
    runs = []
    t0 = time.time()
    for seed in range(args.seeds):
        for clip in (False,) if args.no_clip_only else (False, True):
            r = run(
                data,
                width=args.width,
                depth=args.depth,
                lr=args.lr,
                tau=args.tau,
                steps=args.steps,
                seed=seed,
                context=args.context,
                batch_size=args.batch_size,
                clip=clip,
            )
            m = np.asarray(r["max_logit"])
            print(
                f"seed {seed} clip={clip}: loss {r['final_loss']:.4f}; max logit step 1 {m[0].max():.2f}, "
                f"peak {m.max():.2f}, last {m[-1].max():.2f}; end max logit {max(r['end_max_logit']):.2f}, "
                f"bound {max(r['end_bound']):.1f} ({time.time() - t0:.0f}s)",
                flush=True,
            )
            runs.append(r)
    if not args.no_clip_only:
        os.makedirs(args.out, exist_ok=True)
        plot(runs, os.path.join(args.out, "qk_clip.png"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f)


if __name__ == "__main__":
    main()
