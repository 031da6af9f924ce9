"""GPT depth transfer: one peak learning rate for a GPT-style decoder at every depth?

The depth paper's Figures 2 and 4 on a small byte-level GPT: pre-LN decoder
(``spectral_optax.nn.linen.Transformer``, fused QKV, GELU MLP, learned
positions, untied head, Parametrization-1 init), K blocks with every branch
``h + alpha f(h)``: ``alpha = 2 / K`` (scaled) or ``1`` (unscaled); ``--forms`` adds
Depth-muP (``depth_mup``: ``alpha = sqrt(2 / K)`` and the block parameters' peak LR
times ``sqrt(2 / K)``, its companion rule; docs/math.md section 5) for the depth rules
side by side. Each
optimizer variant is swept over a factor-2 grid of *peak* LRs (linear warm-up
over 5% of the steps, cosine decay to 0) at every depth; train loss (last 5%
of steps) and validation loss (held-out last 10% of the text) are both
recorded and reported.

    python -m benchmarks.gpt_depth [--quick | --preset cpu|cpu64|gpu] [--json PATH] [--out DIR]
        [--seeds K] [--optimizers muon,moga1.5,moga2,moga2.5,adamw | all] [--data text|text:PATH]
        [--depths 2,4,8] [--steps N] [--width W] [--context T] [--batch-size B] [--dtype bfloat16]
        [--forms unscaled,scaled,depth_mup]

Outputs in OUT: ``gpt_depth_<preset>.jsonl`` (every run; rerunning resumes),
``gpt_depth_<preset>_train.png`` / ``_val.png`` (loss vs LR, one panel per
optimizer, curves per depth, stars at the best LR),
``gpt_depth_<preset>_which_optimizer.png`` (loss vs steps and vs seconds at
each optimizer's best LR) and, with ``--json``, a summary with the schema of
``benchmarks.depth_transfer`` plus tokens per second per run.

Public API only.
"""

from __future__ import annotations

from benchmarks import _devices

_devices.early_flags()  # --devices N: before JAX starts

from spectral_optax import lab  # noqa: E402
from spectral_optax.lab import depth as _depth  # noqa: E402

PRESETS = {
    # ~1e8 flops per step per LR at depth 16 (width 32, 512 tokens per step).
    "quick": {"depths": (2, 8), "width": 32, "context": 64, "batch_size": 8, "steps": 60, "num_lrs": 5,
              "optimizers": ("muon", "moga2"), "dtype": "float32"},
    "cpu": {"depths": (2, 4, 8, 16), "width": 32, "context": 64, "batch_size": 8, "steps": 120, "num_lrs": 6,
            "optimizers": ("muon", "moga2", "adamw"), "dtype": "float32"},
    # The paper's 64x range of depth on a CPU: the cpu preset's sizes at depths up to 128, the five optimizers,
    # 2 seeds at depths 2, 16 and 128, each grid extended (twice at most) where its best sits at an edge.
    "cpu64": {"depths": (2, 4, 8, 16, 32, 64, 128), "width": 32, "context": 64, "batch_size": 8, "steps": 120,
              "num_lrs": 6, "optimizers": ("muon", "moga1.5", "moga2", "moga2.5", "adamw"), "dtype": "float32",
              "seed_depths": ((2, 16, 128), 2), "extend_edges": 2},
    # Not measured yet (no accelerator in the session that wrote it).
    "gpu": {"depths": (2, 4, 8, 16, 32, 64, 128), "width": 256, "context": 256, "batch_size": 32,
            "steps": 2000, "num_lrs": 9, "optimizers": ("muon", "moga1.5", "moga2", "moga2.5", "adamw"),
            "dtype": "bfloat16"},
}

def main(argv=None):
    p = _depth.parser(__doc__.splitlines()[0], PRESETS)
    _devices.add_arguments(p)
    p.add_argument("--data", default="text", help="'text' (embedded pydoc text) or 'text:PATH'")
    p.add_argument("--context", type=int, default=None, help="sequence length (overrides the preset)")
    args = p.parse_args(argv)
    preset, cfg = _depth.config(args, PRESETS)
    if args.context:
        cfg["context"] = args.context
    if not args.data.startswith("text"):
        raise SystemExit(f"--data must be 'text' or 'text:PATH', got {args.data!r}")
    import jax.numpy as jnp

    data = lab.load(args.data, context=cfg["context"], sequence=True)
    dtype = jnp.bfloat16 if cfg["dtype"] == "bfloat16" else None
    tag = f"gpt-w{cfg['width']}-T{cfg['context']}-{cfg['dtype']}"

    def family(form):
        exponent, _ = _depth.FORMS[form]
        return lab.gpt_family(data, width=cfg["width"], scaled=form != "unscaled", dtype=dtype,
                              exponent=exponent if form != "unscaled" else 1.0)

    return _depth.run_and_report(
        benchmark="gpt_depth", family=family, data=data, cfg=cfg, preset=preset, args=args,
        tag=tag, title=f"GPT (width {cfg['width']}, context {cfg['context']}, {cfg['steps']} steps)",
        units_per_step=cfg["batch_size"] * cfg["context"], unit="tokens",
        devices=_devices.setup(args), writer=_devices.is_writer(),
    )


if __name__ == "__main__":
    main()
