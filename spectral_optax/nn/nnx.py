"""Residual building blocks for Flax NNX with an explicit branch multiplier.

The NNX twins of :mod:`spectral_optax.nn.linen` with the same parameter paths
(``input_proj``, ``blocks/dense_0``, ``blocks/dense_1``, ``head``; the
transformer's ``blocks/attn/out`` and ``blocks/mlp/dense_1``), so
:data:`spectral_optax.BRANCH_OUT_PATTERN` selects the branch-last layers
of both. The K blocks are created with ``nnx.vmap`` (every block parameter has
a leading layer axis of size K) and applied with ``nnx.scan``, so depth 64
compiles as fast as depth 2. Pass the live model as ``geometry=model`` to the
optimizers: :meth:`spectral_optax.GeometryMap.from_nnx` reads the stacked
layouts exactly.

Every block computes ``h + alpha * f(h)``, ``alpha = base_blocks / num_blocks``
(``alpha=1.0``: the unscaled baseline); ``absorbed=True`` uses a unit
multiplier and initializes the branch's last layer (kernel and bias) times
``alpha`` (train with :func:`spectral_optax.depth_residual_scale`).

References:
  Wong, Xu, Li, Lu (2026), inverse-depth residual scaling; docs/math.md
  section 5.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_optax._depth import residual_alpha, scale_init

Initializer = Callable[..., Any]
default_kernel_init = nnx.initializers.lecun_normal()


class ResidualMLPBlock(nnx.Module):
    """``h + multiplier * dense_1(relu(dense_0(h)))``; ``dense_1`` init times ``out_scale``."""

    def __init__(
        self,
        features: int,
        hidden_features: int | None = None,
        *,
        multiplier: float = 1.0,
        out_scale: float = 1.0,
        kernel_init: Initializer = default_kernel_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        hidden = hidden_features or features
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.multiplier = multiplier
        self.dense_0 = nnx.Linear(features, hidden, kernel_init=kernel_init, **kw)
        self.dense_1 = nnx.Linear(
            hidden,
            features,
            kernel_init=scale_init(kernel_init, out_scale),
            bias_init=scale_init(nnx.initializers.zeros_init(), out_scale),
            **kw,
        )

    def __call__(self, h):
        y = self.dense_1(jax.nn.relu(self.dense_0(h)))
        return h + jnp.asarray(self.multiplier, y.dtype) * y


class MLPBranch(nnx.Module):
    """``dense_1(gelu(dense_0(h)))``: the transformer's MLP branch."""

    def __init__(self, features, hidden_features, *, out_scale=1.0,
                 kernel_init=default_kernel_init, dtype=None, param_dtype=jnp.float32, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dense_0 = nnx.Linear(features, hidden_features, kernel_init=kernel_init, **kw)
        self.dense_1 = nnx.Linear(
            hidden_features,
            features,
            kernel_init=scale_init(kernel_init, out_scale),
            bias_init=scale_init(nnx.initializers.zeros_init(), out_scale),
            **kw,
        )

    def __call__(self, h):
        return self.dense_1(jax.nn.gelu(self.dense_0(h)))


class TransformerBlock(nnx.Module):
    """Pre-LN block: ``h += m * attn(ln_attn(h))``; ``h += m * mlp(ln_mlp(h))``."""

    def __init__(
        self,
        features: int,
        num_heads: int,
        *,
        mlp_ratio: int = 4,
        multiplier: float = 1.0,
        out_scale: float = 1.0,
        causal: bool = True,
        kernel_init: Initializer = default_kernel_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.multiplier = multiplier
        self.causal = causal
        self.ln_attn = nnx.LayerNorm(features, **kw)
        self.attn = nnx.MultiHeadAttention(
            num_heads=num_heads,
            in_features=features,
            kernel_init=kernel_init,
            out_kernel_init=scale_init(kernel_init, out_scale),
            decode=False,
            deterministic=True,
            **kw,
        )
        self.ln_mlp = nnx.LayerNorm(features, **kw)
        self.mlp = MLPBranch(features, mlp_ratio * features, out_scale=out_scale,
                             kernel_init=kernel_init, **kw)

    def __call__(self, h):
        m = jnp.asarray(self.multiplier, h.dtype)
        mask = nnx.make_causal_mask(jnp.ones(h.shape[:-1], jnp.int32)) if self.causal else None
        h = h + m * self.attn(self.ln_attn(h), mask=mask)
        return h + m * self.mlp(self.ln_mlp(h))


def _stacked(make_block: Callable[[nnx.Rngs], nnx.Module], num_blocks: int, rngs: nnx.Rngs):
    @nnx.split_rngs(splits=num_blocks)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(r):
        return make_block(r)

    return create(rngs)


def _scan_apply(blocks, h):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def step(x, block):
        return block(x)

    return step(h, blocks)


class ResidualMLP(nnx.Module):
    """Residual MLP: ``input_proj`` (after ``embed`` for byte/token inputs),
    K stacked :class:`ResidualMLPBlock` (``h + alpha * f(h)``), ``head``.

    Args:
      in_features: input width (for token inputs: the context length).
      features: residual width; num_blocks: K; out_features: head width.
      base_blocks: K_base; ``alpha = base_blocks / num_blocks`` unless given.
      alpha: branch multiplier override (``1.0``: unscaled baseline).
      absorbed: unit multiplier, ``alpha``-scaled init of ``dense_1``.
      hidden_features: branch inner width (default ``features``).
      vocab_size: if set, integer inputs ``(..., in_features)`` are embedded
        and flattened before ``input_proj``.
    """

    def __init__(
        self,
        in_features: int,
        features: int,
        num_blocks: int,
        out_features: int,
        *,
        base_blocks: int = 2,
        alpha: float | None = None,
        absorbed: bool = False,
        hidden_features: int | None = None,
        vocab_size: int | None = None,
        kernel_init: Initializer = default_kernel_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        a = residual_alpha(num_blocks, base_blocks, alpha=alpha)
        self.branch_alpha = a
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.vocab_size = vocab_size
        d_in = in_features
        if vocab_size is not None:
            self.embed = nnx.Embed(vocab_size, features, rngs=rngs, **kw)
            d_in = in_features * features
        self.input_proj = nnx.Linear(d_in, features, kernel_init=kernel_init, rngs=rngs, **kw)
        mult, out_scale = (1.0, a) if absorbed else (a, 1.0)
        self.blocks = _stacked(
            lambda r: ResidualMLPBlock(features, hidden_features, multiplier=mult,
                                       out_scale=out_scale, kernel_init=kernel_init, rngs=r, **kw),
            num_blocks,
            rngs,
        )
        self.head = nnx.Linear(features, out_features, kernel_init=kernel_init, rngs=rngs, **kw)

    def __call__(self, x):
        if self.vocab_size is not None:
            x = self.embed(x)
            x = x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))
        h = _scan_apply(self.blocks, self.input_proj(x))
        return self.head(h)


class Transformer(nnx.Module):
    """Decoder-only pre-LN transformer LM: ``embed`` + ``pos_embed`` -> K
    stacked :class:`TransformerBlock` -> ``ln_final`` -> ``head``."""

    def __init__(
        self,
        vocab_size: int,
        features: int,
        num_blocks: int,
        num_heads: int,
        *,
        max_len: int = 512,
        mlp_ratio: int = 4,
        base_blocks: int = 2,
        alpha: float | None = None,
        absorbed: bool = False,
        kernel_init: Initializer = default_kernel_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        a = residual_alpha(num_blocks, base_blocks, alpha=alpha)
        self.branch_alpha = a
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.embed = nnx.Embed(vocab_size, features, rngs=rngs, **kw)
        self.pos_embed = nnx.Embed(max_len, features, rngs=rngs, **kw)
        mult, out_scale = (1.0, a) if absorbed else (a, 1.0)
        self.blocks = _stacked(
            lambda r: TransformerBlock(features, num_heads, mlp_ratio=mlp_ratio, multiplier=mult,
                                       out_scale=out_scale, kernel_init=kernel_init, rngs=r, **kw),
            num_blocks,
            rngs,
        )
        self.ln_final = nnx.LayerNorm(features, rngs=rngs, **kw)
        self.head = nnx.Linear(features, vocab_size, kernel_init=kernel_init, rngs=rngs, **kw)

    def __call__(self, tokens):
        h = self.embed(tokens) + self.pos_embed(jnp.arange(tokens.shape[-1]))
        h = _scan_apply(self.blocks, h)
        return self.head(self.ln_final(h))
