"""A decoder LM written as google-deepmind/nanodo writes one (``nanodo/model.py``; written here, not vendored).

The shapes, names and return conventions are nanodo's, so that the recipe runs on code the package did not
shape: a ``DoConfig`` dataclass (``D`` width, ``H`` heads, ``L`` context, ``N`` blocks, ``V`` vocabulary, ``F``
the MLP's inner width), Flax initializers chosen there (``xavier_uniform`` kernels, tables
``variance_scaling(1, 'fan_in', 'normal', out_axis=0)``, i.e. ``N(0, 1 / D)``), every parameter wrapped in
``nn.Partitioned`` boxes for FSDP when ``fsdp_enabled`` (the default there and here), no biases, pre-LayerNorm
blocks without LayerNorm biases, ``DenseGeneral`` query / key / value maps ``D -> (H, D / H)`` and an output
map ``(H, D / H) -> D`` (``attn_out_proj``), learned positions as a second ``nn.Embed`` (``pos_embed``) and logits
by the tied ``embed.attend`` in float32. One addition: ``tied=False`` reads out by a bias-free ``Dense`` named
``head`` (nanodo's FSDP table has a ``'head'`` entry for it), for the untied control.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["CausalAttn", "DoConfig", "Mlp", "TBlock", "TransformerDo"]


@dataclasses.dataclass
class DoConfig:
    """nanodo's hyperparameters of a decoder (field names and defaults as there; ``tied`` added)."""

    D: int  # width (embedding = residual stream = query/key/value total)
    H: int  # attention heads
    L: int  # context (rows of the position table)
    N: int  # blocks
    V: int  # vocabulary
    F: int  # MLP inner width
    kernel_init: Any = nn.initializers.xavier_uniform()
    embed_init: Any = nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
    dtype: Any = jnp.float32
    fsdp_enabled: bool = True
    remat: bool = False
    tied: bool = True


#: nanodo's FSDP layout per layer type: the axis sharded over the mesh's ``'data'`` axis.
_SHARDING = {
    "embedding": (None, "data"),  # (V, D)
    "attn_in_proj": ("data", None, None),  # (D, H, Dh)
    "attn_out_proj": (None, None, "data"),  # (H, Dh, D)
    "mlp_kernel": ("data", None),  # (D, F) and (F, D)
    "head": ("data", None),  # (D, V)
}


def _init(kind: str, cfg: DoConfig):
    base = cfg.embed_init if kind == "embedding" else cfg.kernel_init
    return nn.with_partitioning(base, _SHARDING[kind]) if cfg.fsdp_enabled else base


class CausalAttn(nn.Module):
    """Causal self-attention: ``DenseGeneral`` heads ``query`` / ``key`` / ``value`` and ``attn_out_proj``."""

    cfg: DoConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        if cfg.D % cfg.H:
            raise ValueError(f"DoConfig: D={cfg.D} is not a multiple of H={cfg.H}")
        head_dim = cfg.D // cfg.H
        proj = {
            name: nn.DenseGeneral(
                (cfg.H, head_dim),
                axis=-1,
                use_bias=False,
                dtype=cfg.dtype,
                kernel_init=_init("attn_in_proj", cfg),
                name=name,
            )(x)
            for name in ("query", "key", "value")
        }
        q = proj["query"] / head_dim**0.5
        scores = jnp.einsum("...qhd,...khd->...hqk", q, proj["key"]).astype(jnp.float32)
        length = x.shape[1]
        causal = jnp.tril(jnp.ones((1, 1, length, length), jnp.bool_))
        scores = jnp.where(causal, scores, jnp.finfo(cfg.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(cfg.dtype)
        mixed = jnp.einsum("...hqk,...khd->...qhd", weights, proj["value"])
        return nn.DenseGeneral(
            cfg.D,
            axis=(-2, -1),
            use_bias=False,
            dtype=cfg.dtype,
            kernel_init=_init("attn_out_proj", cfg),
            name="attn_out_proj",
        )(mixed)


class Mlp(nn.Module):
    """``D -> F -> D``, GELU between, bias-free ``Dense`` layers (``Dense_0``, ``Dense_1``)."""

    cfg: DoConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        hidden = nn.Dense(cfg.F, use_bias=False, dtype=cfg.dtype, kernel_init=_init("mlp_kernel", cfg))(x)
        return nn.Dense(cfg.D, use_bias=False, dtype=cfg.dtype, kernel_init=_init("mlp_kernel", cfg))(
            jax.nn.gelu(hidden)
        )


class TBlock(nn.Module):
    """Pre-LayerNorm block: ``x + attn(ln(x))``, then ``+ mlp(ln(.))`` (LayerNorms without bias)."""

    docfg: DoConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.docfg
        x = x + CausalAttn(cfg)(nn.LayerNorm(dtype=cfg.dtype, use_bias=False)(x))
        return x + Mlp(cfg)(nn.LayerNorm(dtype=cfg.dtype, use_bias=False)(x))


class TransformerDo(nn.Module):
    """nanodo's decoder: integer tokens ``(B, L)`` -> float32 logits ``(B, L, V)``.

    Parameters: ``embed`` and ``pos_embed`` (``nn.Embed``), ``blocks_0`` ... ``blocks_{N-1}``, ``out_ln``,
    and with ``tied=False`` a ``head`` ``Dense``.
    """

    docfg: DoConfig

    def setup(self):
        cfg = self.docfg
        self.embed = nn.Embed(cfg.V, cfg.D, embedding_init=_init("embedding", cfg))
        self.pos_embed = nn.Embed(cfg.L, cfg.D, embedding_init=_init("embedding", cfg))
        block = nn.remat(TBlock) if cfg.remat else TBlock
        self.blocks = [block(cfg) for _ in range(cfg.N)]
        self.out_ln = nn.LayerNorm(dtype=cfg.dtype, use_bias=False)
        if not cfg.tied:
            self.head = nn.Dense(cfg.V, use_bias=False, dtype=cfg.dtype, kernel_init=_init("head", cfg))

    def __call__(self, tokens):
        h = self.embed(tokens) + self.pos_embed(jnp.arange(tokens.shape[1])[None, :])
        for block in self.blocks:
            h = block(h)
        h = self.out_ln(h).astype(jnp.float32)
        return self.embed.attend(h) if self.docfg.tied else self.head(h).astype(jnp.float32)
