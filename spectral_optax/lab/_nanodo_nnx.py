""":class:`~spectral_optax.lab.third_party.TransformerDo` written in ``flax.nnx`` (the same model, written here).

The module tree mirrors the Linen one, so that the parameter paths differ only where NNX writes a list
(``blocks/0/...`` for Linen's ``blocks_0/...``): ``embed`` and ``pos_embed`` (``nnx.Embed``), per block
``LayerNorm_0``, ``CausalAttn_0`` (``nnx.LinearGeneral`` ``query`` / ``key`` / ``value`` ``D -> (H, D / H)``
and ``attn_out_proj`` ``(H, D / H) -> D``), ``LayerNorm_1``, ``Mlp_0`` (``Dense_0``, ``Dense_1``), then
``out_ln`` and, untied, ``head``. The initializers are the config's, as in Linen; with ``fsdp_enabled`` the
variables carry nanodo's sharding names (``nnx.with_partitioning``), which NNX applies when it creates them:
build inside a mesh, or with ``fsdp_enabled=False``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_optax.lab._nanodo import _SHARDING, DoConfig

__all__ = ["TransformerDoNNX"]


def _init(kind: str, cfg: DoConfig):
    base = cfg.embed_init if kind == "embedding" else cfg.kernel_init
    return nnx.with_partitioning(base, _SHARDING[kind]) if cfg.fsdp_enabled else base


class _Attn(nnx.Module):
    def __init__(self, cfg: DoConfig, *, rngs: nnx.Rngs):
        if cfg.D % cfg.H:
            raise ValueError(f"DoConfig: D={cfg.D} is not a multiple of H={cfg.H}")
        self.cfg, dh = cfg, cfg.D // cfg.H
        for name in ("query", "key", "value"):
            layer = nnx.LinearGeneral(
                cfg.D, (cfg.H, dh), use_bias=False, dtype=cfg.dtype, kernel_init=_init("attn_in_proj", cfg), rngs=rngs
            )
            setattr(self, name, layer)
        self.attn_out_proj = nnx.LinearGeneral(
            (cfg.H, dh),
            cfg.D,
            axis=(-2, -1),
            use_bias=False,
            dtype=cfg.dtype,
            kernel_init=_init("attn_out_proj", cfg),
            rngs=rngs,
        )

    def __call__(self, x):
        cfg, dh = self.cfg, self.cfg.D // self.cfg.H
        q = self.query(x) / dh**0.5
        scores = jnp.einsum("...qhd,...khd->...hqk", q, self.key(x)).astype(jnp.float32)
        length = x.shape[1]
        causal = jnp.tril(jnp.ones((1, 1, length, length), jnp.bool_))
        weights = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(cfg.dtype).min), axis=-1).astype(cfg.dtype)
        return self.attn_out_proj(jnp.einsum("...hqk,...khd->...qhd", weights, self.value(x)))


class _Mlp(nnx.Module):
    def __init__(self, cfg: DoConfig, *, rngs: nnx.Rngs):
        kw = dict(use_bias=False, dtype=cfg.dtype, kernel_init=_init("mlp_kernel", cfg), rngs=rngs)
        self.Dense_0 = nnx.Linear(cfg.D, cfg.F, **kw)
        self.Dense_1 = nnx.Linear(cfg.F, cfg.D, **kw)

    def __call__(self, x):
        return self.Dense_1(jax.nn.gelu(self.Dense_0(x)))


class _Block(nnx.Module):
    def __init__(self, cfg: DoConfig, *, rngs: nnx.Rngs):
        self.LayerNorm_0 = nnx.LayerNorm(cfg.D, use_bias=False, dtype=cfg.dtype, rngs=rngs)
        self.CausalAttn_0 = _Attn(cfg, rngs=rngs)
        self.LayerNorm_1 = nnx.LayerNorm(cfg.D, use_bias=False, dtype=cfg.dtype, rngs=rngs)
        self.Mlp_0 = _Mlp(cfg, rngs=rngs)

    def __call__(self, x):
        x = x + self.CausalAttn_0(self.LayerNorm_0(x))
        return x + self.Mlp_0(self.LayerNorm_1(x))


class TransformerDoNNX(nnx.Module):
    """:class:`~spectral_optax.lab.third_party.TransformerDo` in NNX: tokens ``(B, L)`` -> float32 logits
    ``(B, L, V)``."""

    def __init__(self, cfg: DoConfig, *, rngs: nnx.Rngs):
        self.tied = cfg.tied
        self.embed = nnx.Embed(cfg.V, cfg.D, embedding_init=_init("embedding", cfg), rngs=rngs)
        self.pos_embed = nnx.Embed(cfg.L, cfg.D, embedding_init=_init("embedding", cfg), rngs=rngs)
        self.blocks = nnx.List([_Block(cfg, rngs=rngs) for _ in range(cfg.N)])
        self.out_ln = nnx.LayerNorm(cfg.D, use_bias=False, dtype=cfg.dtype, rngs=rngs)
        if not cfg.tied:
            self.head = nnx.Linear(
                cfg.D, cfg.V, use_bias=False, dtype=cfg.dtype, kernel_init=_init("head", cfg), rngs=rngs
            )

    def __call__(self, tokens):
        h = self.embed(tokens) + self.pos_embed(jnp.arange(tokens.shape[1])[None, :])
        for block in self.blocks:
            h = block(h)
        h = self.out_ln(h).astype(jnp.float32)
        return self.embed.attend(h) if self.tied else self.head(h).astype(jnp.float32)
