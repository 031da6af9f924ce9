"""Residual building blocks for Flax Linen with an explicit branch multiplier.

Every residual block computes ``h + alpha * f(h)`` with
``alpha = (base_blocks / num_blocks) ** exponent`` (``exponent=1``, the
default: inverse-depth scaling; ``0.5``: Depth-muP; set ``alpha=1.0`` for the
unscaled baseline). With ``absorbed=True`` the multiplier is 1 and the
branch's last layer (kernel and bias) is initialized times ``alpha`` instead:
the absorbed form, to be trained with
:func:`spectral_optax.depth_residual_scale`.

Parameter names follow one convention so that
:data:`spectral_optax.expert.BRANCH_OUT_PATTERN` selects the last layer of
every branch and :func:`spectral_optax.expert.infer_geometry` reads the stacked
kernels without help:

* residual MLP: ``input_proj`` (or ``embed`` + ``input_proj``), ``blocks/dense_0``,
  ``blocks/dense_1`` (the branch's last layer), ``head``;
* transformer: ``embed``, ``pos_embed``, ``blocks/{ln_attn, attn/{query,key,value,out}
  (or fused ``attn/{qkv,out}``), ln_mlp, mlp/{dense_0, dense_1}}``, ``ln_final``, ``head``;
* ResNet: ``conv_in``, ``stage_{s}_blocks_{k}/{ln_0, conv_0, ln_1, conv_1}``,
  ``conv_down_{s}`` at stage changes, ``ln_final``, ``head`` (branch-last layers:
  :data:`RESNET_BRANCH_OUT_PATTERN`).

With ``scan=True`` (default) the K blocks are one ``nn.scan``: every block
parameter has a leading layer axis of size K (a batch axis of its geometry)
and depth 64 compiles as fast as depth 2. With ``scan=False`` the blocks are
``blocks_0 .. blocks_{K-1}``.

References:
  Wong, Xu, Li, Lu (2026), inverse-depth residual scaling; docs/math.md
  section 5.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from spectral_optax import attention_max_logits, residual_alpha
from spectral_optax.expert import MAX_LOGITS, scale_init
from spectral_optax.nn._sharded import Embed, gathered

Initializer = Callable[..., Any]
default_kernel_init = nn.initializers.lecun_normal()

# Twins kept on purpose: each module spells out its own attributes (``features`` ... ``kernel_init``, ``dtype``,
# ``param_dtype``) and :mod:`spectral_optax.nn.nnx` spells out each twin's ``__init__`` in the same order. A
# shared Linen base class would put its fields first in every constructor (dataclass order), and Linen creates
# parameters inside ``__call__`` where NNX creates them in ``__init__``: the twins share the rules
# (``_multiplier_and_out_scale``, ``_check_qkv``, ``residual_alpha``), not the module code.


def _multiplier_and_out_scale(alpha: float, absorbed: bool) -> tuple[float, float]:
    """(branch multiplier, init factor of the branch's last layer)."""
    return (1.0, alpha) if absorbed else (alpha, 1.0)


class MLPBranch(nn.Module):
    """``f(h) = dense_1(gelu(dense_0(h)))``: the transformer's MLP branch
    (tanh-approximate GELU, ``jax.nn.gelu``; the NNX twin's function).

    Attributes:
      features: output width (the residual stream width).
      hidden_features: inner width (default ``features``).
      out_scale: the last layer's init (kernel and bias) is multiplied by it.
    """

    features: int
    hidden_features: int | None = None
    out_scale: float = 1.0
    kernel_init: Initializer = default_kernel_init
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h):
        hidden = self.hidden_features or self.features
        y = nn.Dense(
            hidden, kernel_init=self.kernel_init, dtype=self.dtype, param_dtype=self.param_dtype, name="dense_0"
        )(h)
        y = nn.gelu(y)
        return nn.Dense(
            self.features,
            kernel_init=scale_init(self.kernel_init, self.out_scale),
            bias_init=scale_init(nn.initializers.zeros_init(), self.out_scale),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="dense_1",
        )(y)


class ResidualMLPBlock(nn.Module):
    """``h + multiplier * f(h)`` with ``f = Dense -> ReLU -> Dense``.

    The two Dense layers are direct children (``dense_0``, ``dense_1``) so the
    stacked kernels keep Flax Dense names.
    """

    features: int
    hidden_features: int | None = None
    multiplier: float = 1.0
    out_scale: float = 1.0
    kernel_init: Initializer = default_kernel_init
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h, _=None):
        hidden = self.hidden_features or self.features
        y = nn.Dense(
            hidden, kernel_init=self.kernel_init, dtype=self.dtype, param_dtype=self.param_dtype, name="dense_0"
        )(h)
        y = nn.relu(y)
        y = nn.Dense(
            self.features,
            kernel_init=scale_init(self.kernel_init, self.out_scale),
            bias_init=scale_init(nn.initializers.zeros_init(), self.out_scale),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="dense_1",
        )(y)
        return h + jnp.asarray(self.multiplier, y.dtype) * y, None


QKV_LAYOUTS = ("split", "fused")


def _recording_attention(query, key, value, mask=None, dtype=None, precision=None, module=None):
    """``nn.dot_product_attention`` that sows the per-head max logits into ``module``
    (``intermediates/.../max_logits``, :func:`spectral_optax.attention_max_logits`)."""
    if module is not None:
        module.sow("intermediates", MAX_LOGITS, attention_max_logits(query, key, mask))
    return nn.dot_product_attention(query, key, value, mask=mask, dtype=dtype, precision=precision)


def _check_qkv(qkv: str) -> str:
    if qkv not in QKV_LAYOUTS:
        raise ValueError(f"qkv must be one of {QKV_LAYOUTS}, got {qkv!r}")
    return qkv


class FusedSelfAttention(nn.Module):
    """Multi-head self-attention with one fused ``qkv`` projection.

    ``[q | k | v] = x W_qkv + b`` (``qkv/kernel``: ``(features, 3 features)``,
    three independent ``features x features`` maps: its geometry has
    ``fan_out_splits=3``), per head ``softmax(q k^T / sqrt(d_head) + mask) v``,
    then ``out`` (a DenseGeneral over ``(heads, d_head)``, kernel
    ``(heads, d_head, features)``, the same layout as the split form's
    ``attn/out``). Same function as ``nn.MultiHeadDotProductAttention`` with
    ``W_qkv = [W_q | W_k | W_v]`` (heads flattened). ``record_max_logits=True`` sows the
    per-head max logits (``intermediates/.../attn/max_logits``, shape ``(num_heads,)``).
    """

    num_heads: int
    record_max_logits: bool = False
    kernel_init: Initializer = default_kernel_init
    out_kernel_init: Initializer = default_kernel_init
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, mask=None):
        d = x.shape[-1]
        if d % self.num_heads:
            raise ValueError(f"features={d} is not divisible by num_heads={self.num_heads}")
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        qkv = nn.Dense(3 * d, kernel_init=self.kernel_init, name="qkv", **kw)(x)
        qkv = qkv.reshape(x.shape[:-1] + (3, self.num_heads, d // self.num_heads))
        if self.record_max_logits:
            self.sow("intermediates", MAX_LOGITS, attention_max_logits(qkv[..., 0, :, :], qkv[..., 1, :, :], mask))
        y = nn.dot_product_attention(
            qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :], mask=mask, deterministic=True, dtype=self.dtype
        )
        return nn.DenseGeneral(d, axis=(-2, -1), kernel_init=self.out_kernel_init, name="out", **kw)(y)


class TransformerBlock(nn.Module):
    """Pre-LN transformer block with explicit branch multipliers.

    ``h <- h + m * attn(LN(h))``; ``h <- h + m * mlp(LN(h))`` where ``mlp`` is
    ``dense_0 -> GELU -> dense_1`` of inner width ``mlp_ratio * features``.
    The last layers of the two branches are ``attn/out`` and ``mlp/dense_1``.

    Attributes:
      features: residual width; num_heads: attention heads.
      multiplier: branch multiplier ``m``; out_scale: init factor of
        ``attn/out`` and ``mlp/dense_1``.
      causal: apply a causal mask (inputs ``(batch, seq, features)``).
      qkv: ``'split'`` (``attn/{query,key,value}``, Flax's
        ``MultiHeadDotProductAttention``) or ``'fused'`` (one ``attn/qkv``,
        ``FusedSelfAttention``).
      record_max_logits: sow the attention's per-head max logits
        (``intermediates``, key ``max_logits``; off by default, no cost when off).
    """

    features: int
    num_heads: int
    mlp_ratio: int = 4
    multiplier: float = 1.0
    out_scale: float = 1.0
    causal: bool = True
    qkv: str = "split"
    record_max_logits: bool = False
    kernel_init: Initializer = default_kernel_init
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h, _=None):
        m = jnp.asarray(self.multiplier, h.dtype if self.dtype is None else self.dtype)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        y = nn.LayerNorm(name="ln_attn", **kw)(h)
        mask = nn.make_causal_mask(jnp.ones(h.shape[:-1], jnp.int32)) if self.causal else None
        out_init = scale_init(self.kernel_init, self.out_scale)
        if _check_qkv(self.qkv) == "fused":
            y = FusedSelfAttention(
                self.num_heads,
                record_max_logits=self.record_max_logits,
                kernel_init=self.kernel_init,
                out_kernel_init=out_init,
                name="attn",
                **kw,
            )(y, mask=mask)
        else:
            rec: dict[str, Any] = {"attention_fn": _recording_attention} if self.record_max_logits else {}
            y = nn.MultiHeadDotProductAttention(
                num_heads=self.num_heads,
                kernel_init=self.kernel_init,
                out_kernel_init=out_init,
                deterministic=True,
                name="attn",
                **rec,
                **kw,
            )(y, mask=mask, sow_weights=self.record_max_logits)
        h = h + m * y
        y = nn.LayerNorm(name="ln_mlp", **kw)(h)
        y = MLPBranch(
            self.features,
            self.mlp_ratio * self.features,
            out_scale=self.out_scale,
            kernel_init=self.kernel_init,
            name="mlp",
            **kw,
        )(y)
        return h + m * y, None


def _stack(block_cls, num_blocks: int, scan: bool, **block_kwargs):
    """K blocks as one ``nn.scan`` (params stacked on axis 0) or unrolled; on an Explicit mesh each
    block reads its (one layer's) parameters replicated (:func:`~spectral_optax.nn._sharded.gathered`)."""
    block_cls = gathered(block_cls)
    if scan:
        stacked = nn.scan(
            block_cls,
            variable_axes={"params": 0, "intermediates": 0},
            split_rngs={"params": True},
            length=num_blocks,
        )(name="blocks", **block_kwargs)

        def apply(h):
            h, _ = stacked(h, None)
            return h

        return apply
    blocks = [block_cls(name=f"blocks_{k}", **block_kwargs) for k in range(num_blocks)]

    def apply_unrolled(h):
        for b in blocks:
            h, _ = b(h)
        return h

    return apply_unrolled


class _BranchAlpha:
    """``branch_alpha``, the multiplier ``alpha`` of every block of a model with ``num_blocks``, ``base_blocks``,
    ``alpha`` and ``exponent`` attributes (:func:`spectral_optax.residual_alpha`)."""

    num_blocks: Any
    base_blocks: Any
    alpha: Any
    exponent: Any

    @property
    def branch_alpha(self) -> float:
        return residual_alpha(self.num_blocks, self.base_blocks, alpha=self.alpha, exponent=self.exponent)


class ResidualMLP(_BranchAlpha, nn.Module):
    """Residual MLP: input projection, K residual blocks, read-out head.

    ``h_0 = input_proj(x)``; ``h_{k+1} = h_k + alpha * f_k(h_k)``,
    ``f_k = Dense -> ReLU -> Dense`` at fixed width; ``y = head(h_K)``.
    The projections are outside the stack, so only the blocks change with
    depth.

    Attributes:
      features: residual width.
      num_blocks: K.
      out_features: head width (classes / vocabulary).
      base_blocks: K_base; ``alpha = (base_blocks / num_blocks) ** exponent``
        unless ``alpha`` is given (``alpha=1.0``: the unscaled baseline).
      exponent: ``a`` of the rule (1: inverse depth, default; 0.5: Depth-muP's
        ``1 / sqrt(K)``, trained with :func:`spectral_optax.depth_lr_scale`).
      absorbed: unit multiplier and ``alpha``-scaled init of ``dense_1``
        (train with :func:`spectral_optax.depth_residual_scale`).
      hidden_features: branch inner width (default ``features``).
      vocab_size: if set, integer inputs ``(..., T)`` are embedded
        (``embed``, width ``features``) and flattened before ``input_proj``.
      scan: stack the blocks with ``nn.scan`` (default) or unroll them.
    """

    features: int
    num_blocks: int
    out_features: int
    base_blocks: int = 2
    alpha: float | None = None
    exponent: float = 1.0
    absorbed: bool = False
    hidden_features: int | None = None
    vocab_size: int | None = None
    scan: bool = True
    kernel_init: Initializer = default_kernel_init
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        if self.vocab_size is not None:
            x = Embed(self.vocab_size, self.features, name="embed", **kw)(x)
            x = x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))
        h = gathered(nn.Dense)(self.features, kernel_init=self.kernel_init, name="input_proj", **kw)(x)
        mult, out_scale = _multiplier_and_out_scale(self.branch_alpha, self.absorbed)
        h = _stack(
            ResidualMLPBlock,
            self.num_blocks,
            self.scan,
            features=self.features,
            hidden_features=self.hidden_features,
            multiplier=mult,
            out_scale=out_scale,
            kernel_init=self.kernel_init,
            **kw,
        )(h)
        return gathered(nn.Dense)(self.out_features, kernel_init=self.kernel_init, name="head", **kw)(h)


class Transformer(_BranchAlpha, nn.Module):
    """Decoder-only pre-LN transformer LM (GPT-style) with inverse-depth branch scaling.

    ``h_0 = embed(tokens) + pos_embed(positions)`` (learned positions), then K
    :class:`TransformerBlock` (causal self-attention and a GELU MLP, each
    branch ``h + alpha * f(LN(h))``), ``ln_final``, and an untied ``head``.
    Inputs are token ids ``(batch, seq)``; outputs logits
    ``(batch, seq, vocab_size)``.

    Every parameter's geometry is inferred without overrides (scanned or
    unrolled, split or fused QKV): embeddings are ``embedding``, ``head`` the
    ``output`` matrix, ``attn/qkv`` three ``features x features`` maps,
    ``attn/out`` a ``(heads x d_head) -> features`` map, norms and biases
    vectors; with ``scan=True`` the layer axis is a batch axis.

    Attributes: as :class:`ResidualMLP`, plus ``num_heads``, ``mlp_ratio``,
    ``max_len`` (positional table size), ``qkv`` (``'split'`` or ``'fused'``,
    see :class:`TransformerBlock`), ``embedding_init`` (both tables; default
    Flax's), ``record_max_logits`` (every block's attention sows its per-head max
    logits: ``model.apply(v, x, mutable=['intermediates'])``, then
    :func:`spectral_optax.collect_max_logits`).
    """

    vocab_size: int
    features: int
    num_blocks: int
    num_heads: int
    max_len: int = 512
    mlp_ratio: int = 4
    base_blocks: int = 2
    alpha: float | None = None
    exponent: float = 1.0
    absorbed: bool = False
    scan: bool = True
    qkv: str = "split"
    record_max_logits: bool = False
    kernel_init: Initializer = default_kernel_init
    embedding_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens):
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        if tokens.shape[-1] > self.max_len:
            raise ValueError(f"sequence length {tokens.shape[-1]} exceeds max_len={self.max_len}")
        emb = dict(embedding_init=self.embedding_init, **kw)
        h = Embed(self.vocab_size, self.features, name="embed", **emb)(tokens)
        pos = Embed(self.max_len, self.features, name="pos_embed", **emb)(jnp.arange(tokens.shape[-1]))
        h = h + pos
        mult, out_scale = _multiplier_and_out_scale(self.branch_alpha, self.absorbed)
        h = _stack(
            TransformerBlock,
            self.num_blocks,
            self.scan,
            features=self.features,
            num_heads=self.num_heads,
            mlp_ratio=self.mlp_ratio,
            multiplier=mult,
            out_scale=out_scale,
            qkv=self.qkv,
            record_max_logits=self.record_max_logits,
            kernel_init=self.kernel_init,
            **kw,
        )(h)
        h = gathered(nn.LayerNorm)(name="ln_final", **kw)(h)
        return gathered(nn.Dense)(self.vocab_size, kernel_init=self.kernel_init, name="head", **kw)(h)


#: The last layer of every ResNet branch (``conv_1`` of each block): the
#: ``mask`` of :func:`spectral_optax.depth_scaled_init` /
#: :func:`spectral_optax.depth_residual_scale` for the absorbed form.
RESNET_BRANCH_OUT_PATTERN = r"(^|/)stage_\d+_blocks_\d+/conv_1/(kernel|bias)$"


class ResNetBlock(nn.Module):
    """Pre-activation basic block: ``h + m * conv_1(relu(ln_1(conv_0(relu(ln_0(h))))))``.

    Two 3x3 convolutions at constant width and resolution; ``ln_i`` are
    LayerNorms over the channels (per pixel: no batch statistics, so the
    model is a pure function of its parameters). ``conv_1`` (the branch's
    last layer) is initialized times ``out_scale``.
    """

    features: int
    multiplier: float = 1.0
    out_scale: float = 1.0
    kernel_init: Initializer = default_kernel_init
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h):
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        y = nn.Conv(self.features, (3, 3), kernel_init=self.kernel_init, name="conv_0", **kw)(
            nn.relu(nn.LayerNorm(name="ln_0", **kw)(h))
        )
        y = nn.Conv(
            self.features,
            (3, 3),
            kernel_init=scale_init(self.kernel_init, self.out_scale),
            bias_init=scale_init(nn.initializers.zeros_init(), self.out_scale),
            name="conv_1",
            **kw,
        )(nn.relu(nn.LayerNorm(name="ln_1", **kw)(y)))
        return h + jnp.asarray(self.multiplier, y.dtype) * y


class ResNet(_BranchAlpha, nn.Module):
    """CIFAR-style ResNet with inverse-depth branch scaling.

    ``conv_in`` (3x3, ``features`` channels), then ``num_stages`` (default
    three) stages of K basic blocks (:class:`ResNetBlock`, ``h + alpha * f(h)``)
    at widths ``features * 2**s`` (``(1, 2, 4)``); before every stage but the
    first a stride-2 3x3 ``conv_down_{s}`` doubles the channels and halves the
    resolution (outside the residual stacks, so only the blocks change with
    K; four stages of K = 2, 4, 8 are the depth paper's 8, 16, 32 blocks, its
    ResNet-18, -34, -66). Then ``ln_final``,
    ReLU, global average pooling and ``head``. ``alpha = base_blocks / K``
    (K = blocks per stage; ``(base_blocks / K) ** exponent`` with
    ``exponent``, default 1) unless ``alpha`` is given (``1.0``: unscaled);
    ``absorbed=True`` uses a unit multiplier and initializes ``conv_1`` times
    ``alpha`` (mask: :data:`RESNET_BRANCH_OUT_PATTERN`).

    Parameter paths: ``conv_in``, ``stage_{s}_blocks_{k}/{ln_0, conv_0, ln_1,
    conv_1}``, ``conv_down_{s}``, ``ln_final``, ``head``. Conv kernels
    ``(3, 3, in, out)`` are ``(window x in) -> out`` matrices for the
    geometry, inferred from their names.

    Inputs: images ``(batch, H, W, C)``; outputs logits ``(batch, num_classes)``.
    """

    features: int
    num_blocks: int
    num_classes: int
    base_blocks: int = 2
    alpha: float | None = None
    exponent: float = 1.0
    absorbed: bool = False
    kernel_init: Initializer = default_kernel_init
    dtype: Any = None
    param_dtype: Any = jnp.float32
    num_stages: int = 3

    @nn.compact
    def __call__(self, x):
        if x.ndim != 4:
            raise ValueError(f"ResNet expects images (batch, H, W, C), got shape {x.shape}")
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        mult, out_scale = _multiplier_and_out_scale(self.branch_alpha, self.absorbed)
        h = nn.Conv(self.features, (3, 3), kernel_init=self.kernel_init, name="conv_in", **kw)(x)
        for s in range(self.num_stages):
            width = self.features * 2**s
            if s:
                h = nn.Conv(width, (3, 3), strides=(2, 2), kernel_init=self.kernel_init, name=f"conv_down_{s}", **kw)(h)
            for k in range(self.num_blocks):
                h = ResNetBlock(
                    width,
                    multiplier=mult,
                    out_scale=out_scale,
                    kernel_init=self.kernel_init,
                    name=f"stage_{s}_blocks_{k}",
                    **kw,
                )(h)
        h = nn.relu(nn.LayerNorm(name="ln_final", **kw)(h)).mean(axis=(1, 2))
        return nn.Dense(self.num_classes, kernel_init=self.kernel_init, name="head", **kw)(h)


# The Linen modules; spectral_optax.nn.nnx lists their NNX twins in the same order (one model, two Flax APIs).
__all__ = [
    "Embed",
    "MLPBranch",
    "ResidualMLPBlock",
    "FusedSelfAttention",
    "TransformerBlock",
    "ResidualMLP",
    "Transformer",
    "ResNetBlock",
    "ResNet",
    "RESNET_BRANCH_OUT_PATTERN",
]
