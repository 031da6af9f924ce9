"""Small decoder LMs in the style of google-deepmind/nanodo's ``model.py`` (written here, not vendored).

``TiedDecoder``: learned positions, pre-norm blocks with ``DenseGeneral``
attention heads, logits by the tied ``embed.attend``. ``UntiedDecoder``: the
same with a separate ``Dense`` head.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class Block(nn.Module):
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


class TiedDecoder(nn.Module):
    d: int
    vocab: int = 256
    layers: int = 2
    context: int = 16
    tied: bool = True  # logits by embed.attend (nanodo); False: a separate Dense head

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.d, name="embed")
        pos = self.param("pos_embed", nn.initializers.normal(0.02), (self.context, self.d))
        x = embed(tokens) + pos[: tokens.shape[1]]
        for i in range(self.layers):
            x = Block(self.d, name=f"block_{i}")(x)
        x = nn.LayerNorm(name="out_norm")(x)
        return embed.attend(x) if self.tied else nn.Dense(self.vocab, name="head")(x)


class UntiedDecoder(TiedDecoder):
    tied: bool = False
