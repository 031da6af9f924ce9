"""A small decoder LM in the style of google-deepmind/nanodo's ``model.py`` (written here, not vendored).

Learned positions, pre-norm blocks with ``DenseGeneral`` attention heads of size 16 and a GELU MLP, and
logits by the tied ``embed.attend`` (``tied=True``) or a separate ``Dense`` head. The tied-embedding
experiments (``benchmarks.tied_transfer``) and the tied-embedding tests train this one model.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

__all__ = ["Decoder"]


class _Block(nn.Module):
    d: int
    head_dim: int = 16

    @nn.compact
    def __call__(self, x):
        heads = self.d // self.head_dim
        h = nn.LayerNorm()(x)
        q, k, v = (nn.DenseGeneral((heads, self.head_dim), name=n)(h) for n in ("query", "key", "value"))
        t = x.shape[1]
        mask = jnp.tril(jnp.ones((t, t), bool))
        w = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(self.head_dim)
        w = nn.softmax(jnp.where(mask, w, -1e9), axis=-1)
        a = jnp.einsum("bhqk,bkhd->bqhd", w, v)
        x = x + nn.DenseGeneral(self.d, axis=(-2, -1), name="attn_out")(a)
        h = nn.LayerNorm()(x)
        return x + nn.Dense(self.d, name="mlp_out")(nn.gelu(nn.Dense(4 * self.d, name="mlp_in")(h)))


class Decoder(nn.Module):
    """nanodo-style decoder LM on integer tokens ``(batch, time)``, logits ``(batch, time, vocab)``.

    Attributes:
      d: the width (embedding and residual stream); attention heads of size 16.
      context: the longest sequence (rows of the learned position table ``pos_embed``).
      vocab: the vocabulary (rows of ``embed``).
      layers: the number of blocks (``block_0``, ...).
      tied: logits by ``embed.attend`` (the tied table); ``False``: a separate ``Dense`` head.
    """

    d: int
    context: int = 16
    vocab: int = 256
    layers: int = 2
    tied: bool = True

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.d, name="embed")
        pos = self.param("pos_embed", nn.initializers.normal(0.02), (self.context, self.d))
        x = embed(tokens) + pos[: tokens.shape[1]]
        for i in range(self.layers):
            x = _Block(self.d, name=f"block_{i}")(x)
        x = nn.LayerNorm(name="out_norm")(x)
        return embed.attend(x) if self.tied else nn.Dense(self.vocab, name="head")(x)
