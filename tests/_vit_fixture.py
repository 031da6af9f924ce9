"""A small ViT classifier in the style of google-research/big_vision's ``vit.py`` (written here, not vendored).

Patch embedding by a strided ``Conv`` (``embedding``), learned positions
(``pos_embedding``), pre-norm encoder blocks (``MultiHeadDotProductAttention``
and a GELU ``MlpBlock``), ``encoder_norm``, global average pooling and a
zero-initialized ``head`` (big_vision's ``head_zeroinit=True``).
"""

from __future__ import annotations

import flax.linen as nn


class MlpBlock(nn.Module):
    mlp_dim: int

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        return nn.Dense(d, name="Dense_1")(nn.gelu(nn.Dense(self.mlp_dim, name="Dense_0")(x)))


class EncoderBlock(nn.Module):
    mlp_dim: int
    num_heads: int

    @nn.compact
    def __call__(self, x):
        y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, name="MultiHeadDotProductAttention_0")(
            nn.LayerNorm(name="LayerNorm_0")(x)
        )
        x = x + y
        return x + MlpBlock(self.mlp_dim, name="MlpBlock_0")(nn.LayerNorm(name="LayerNorm_1")(x))


class ViT(nn.Module):
    width: int
    num_classes: int = 10
    patch: int = 4
    depth: int = 2
    head_dim: int = 16

    @nn.compact
    def __call__(self, images):
        x = nn.Conv(self.width, (self.patch, self.patch), strides=self.patch, padding="VALID", name="embedding")(images)
        n, h, w, c = x.shape
        x = x.reshape(n, h * w, c)
        x = x + self.param("pos_embedding", nn.initializers.normal(stddev=1 / c**0.5), (1, h * w, c))
        for i in range(self.depth):
            x = EncoderBlock(4 * self.width, self.width // self.head_dim, name=f"encoderblock_{i}")(x)
        x = nn.LayerNorm(name="encoder_norm")(x).mean(axis=1)
        return nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros, name="head")(x)
