"""Flax building blocks for residual networks with inverse-depth branch scaling.

``spectral_optax.nn.linen``: :class:`~spectral_optax.nn.linen.ResidualMLP`,
:class:`~spectral_optax.nn.linen.TransformerBlock`,
:class:`~spectral_optax.nn.linen.Transformer` (a GPT-style decoder: fused or
split QKV, scanned or unrolled blocks), :class:`~spectral_optax.nn.linen.ResNet`
(CIFAR-style, three stages of K basic blocks) and the blocks they stack;
``spectral_optax.nn.nnx``: the NNX twins with the same parameter paths.

Every block computes ``h + alpha * f(h)`` with ``alpha = base_blocks /
num_blocks``; ``absorbed=True`` builds the equivalent absorbed form for
:func:`spectral_optax.depth_residual_scale`.
"""

from spectral_optax.nn import linen, nnx
from spectral_optax.nn.linen import (
    RESNET_BRANCH_OUT_PATTERN,
    ResidualMLP,
    ResNet,
    ResNetBlock,
    Transformer,
    TransformerBlock,
)

__all__ = [
    "RESNET_BRANCH_OUT_PATTERN", "ResNet", "ResNetBlock", "ResidualMLP", "Transformer",
    "TransformerBlock", "linen", "nnx",
]
