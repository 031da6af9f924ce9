"""ResNet depth transfer: one peak learning rate for a CIFAR-style ResNet at every depth?

The depth paper's Figures 3 and 5 at CPU scale: ``spectral_optax.nn.linen.ResNet``
(``--stages`` stages, default three, of K pre-activation basic blocks, two 3x3 convolutions each,
every block ``h + alpha f(h)``, ``alpha = 2 / K`` scaled or ``1`` unscaled;
Parametrization-1 init, conv kernels as ``(window x in) -> out`` matrices),
swept over a factor-2 grid of *peak* LRs (5% linear warm-up, cosine decay)
at every K, train and validation loss both reported.

    python -m benchmarks.resnet_depth [--quick | --preset cpu|cpu_paper|gpu] [--json PATH] [--out DIR]
        [--seeds K] [--optimizers muon,moga1.5,moga2,moga2.5,adamw | all]
        [--data digits_aug | cifar10:DIR | cifar100:DIR] [--depths 2,4,8] [--steps N]
        [--width W] [--batch-size B] [--dtype bfloat16] [--stages S]

Default data: the embedded 8x8 digits, augmented (random translations of up
to 1 pixel on a 10x10 canvas, random contrast, pixel noise; 8 copies per
training image; held-out digits for validation: ``lab.digits_augmented``), so
the train loss stays clearly above 0 at the best LR. CIFAR-10/100 binary
batches from a local directory with ``--data cifar100:DIR``.

Outputs in OUT: ``resnet_depth_<preset>.jsonl`` (resumable),
``resnet_depth_<preset>_train.png`` / ``_val.png``,
``resnet_depth_<preset>_which_optimizer.png``, and with ``--json`` the
summary (schema of ``benchmarks.depth_transfer``) and images per second.

Public API only.
"""

from __future__ import annotations

from benchmarks import _devices

_devices.early_flags()  # --devices N: before JAX starts

from spectral_optax import lab  # noqa: E402
from spectral_optax.lab import depth as _depth  # noqa: E402

PRESETS = {
    "quick": {"depths": (2, 4), "width": 8, "batch_size": 32, "steps": 80, "num_lrs": 5,
              "optimizers": ("muon", "moga2"), "dtype": "float32"},
    "cpu": {"depths": (2, 4, 8), "width": 8, "batch_size": 32, "steps": 100, "num_lrs": 5,
            "optimizers": ("muon", "moga2", "adamw"), "dtype": "float32"},
    # The paper's block counts on a CPU: four stages of K = 2, 4, 8 blocks (8, 16, 32 in all: ResNet-18, -34,
    # -66), the five optimizers, each grid extended (twice at most) where its best sits at an edge.
    "cpu_paper": {"depths": (2, 4, 8), "stages": 4, "width": 8, "batch_size": 32, "steps": 100, "num_lrs": 5,
                  "optimizers": ("muon", "moga1.5", "moga2", "moga2.5", "adamw"), "dtype": "float32",
                  "extend_edges": 4},
    # Not measured yet (no accelerator in the session that wrote it); meant for --data cifar100:DIR.
    "gpu": {"depths": (2, 4, 8), "stages": 4, "width": 16, "batch_size": 128, "steps": 4000, "num_lrs": 9,
            "optimizers": ("muon", "moga1.5", "moga2", "moga2.5", "adamw"), "dtype": "bfloat16"},
}

def main(argv=None):
    p = _depth.parser(__doc__.splitlines()[0], PRESETS)
    _devices.add_arguments(p)
    p.add_argument("--data", default="digits_aug", help="digits_aug | cifar10:DIR | cifar100:DIR")
    p.add_argument("--stages", type=int, default=None, help="stages of K blocks (overrides the preset; default 3)")
    args = p.parse_args(argv)
    preset, cfg = _depth.config(args, PRESETS)
    cfg["stages"] = args.stages or cfg.get("stages", 3)
    import jax.numpy as jnp

    data = lab.load(args.data, flatten=False)
    dtype = jnp.bfloat16 if cfg["dtype"] == "bfloat16" else None
    tag = f"resnet-w{cfg['width']}-{cfg['dtype']}" + (f"-s{cfg['stages']}" if cfg["stages"] != 3 else "")

    if "depth_mup" in cfg["forms"]:
        raise SystemExit("--forms depth_mup: only benchmarks.gpt_depth builds the Depth-muP ResNet rule so far")

    def family(form):
        return lab.resnet_family(data, width=cfg["width"], scaled=form == "scaled", dtype=dtype, stages=cfg["stages"])

    return _depth.run_and_report(
        benchmark="resnet_depth", family=family, data=data, cfg=cfg, preset=preset, args=args,
        tag=tag, title=f"ResNet ({data.name}, width {cfg['width']}, {cfg['stages']} stages, {cfg['steps']} steps)",
        units_per_step=cfg["batch_size"], unit="images",
        devices=_devices.setup(args), writer=_devices.is_writer(),
    )


if __name__ == "__main__":
    main()
