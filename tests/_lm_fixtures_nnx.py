"""The decoders of ``_lm_fixtures`` written in ``flax.nnx`` (the same style, written here, not vendored).

``NNXDecoder(d, tied=True)``: learned positions, pre-norm blocks with
``LinearGeneral``-style attention heads (``nnx.Linear`` on the flattened heads),
logits by the tied ``embed.attend``; ``tied=False``: a separate ``nnx.Linear``
head. Flax's default initializers throughout (the model as its author wrote it).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class NNXBlock(nnx.Module):
    def __init__(self, d: int, *, head_dim: int = 16, rngs: nnx.Rngs):
        self.heads, self.head_dim = d // head_dim, head_dim
        self.norm1 = nnx.LayerNorm(d, rngs=rngs)
        self.query = nnx.Linear(d, d, rngs=rngs)
        self.key = nnx.Linear(d, d, rngs=rngs)
        self.value = nnx.Linear(d, d, rngs=rngs)
        self.attn_out = nnx.Linear(d, d, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d, rngs=rngs)
        self.mlp_in = nnx.Linear(d, 4 * d, rngs=rngs)
        self.mlp_out = nnx.Linear(4 * d, d, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).reshape(b, t, self.heads, self.head_dim) for f in (self.query, self.key, self.value))
        mask = jnp.tril(jnp.ones((t, t), bool))
        w = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(self.head_dim)
        w = nnx.softmax(jnp.where(mask, w, -1e9), axis=-1)
        a = jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, t, d)
        x = x + self.attn_out(a)
        return x + self.mlp_out(nnx.gelu(self.mlp_in(self.norm2(x))))


class NNXDecoder(nnx.Module):
    def __init__(
        self, d: int, *, vocab: int = 256, layers: int = 2, context: int = 16, tied: bool = True, rngs: nnx.Rngs
    ):
        self.tied = tied
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.pos_embed = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (context, d)))
        self.blocks = nnx.List([NNXBlock(d, rngs=rngs) for _ in range(layers)])
        self.out_norm = nnx.LayerNorm(d, rngs=rngs)
        self.head = None if tied else nnx.Linear(d, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens) + self.pos_embed[...][: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        x = self.out_norm(x)
        return self.embed.attend(x) if self.head is None else self.head(x)
