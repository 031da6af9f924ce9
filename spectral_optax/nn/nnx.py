"""Residual building blocks for Flax NNX with an explicit branch multiplier.

The NNX twins of :mod:`spectral_optax.nn.linen` with the same parameter paths
(``input_proj``, ``blocks/dense_0``, ``blocks/dense_1``, ``head``; the
transformer's ``blocks/attn/out`` and ``blocks/mlp/dense_1``), so
:data:`spectral_optax.expert.BRANCH_OUT_PATTERN` selects the branch-last layers
of both. The K blocks are created with ``nnx.vmap`` (every block parameter has
a leading layer axis of size K) and applied with ``nnx.scan``, so depth 64
compiles as fast as depth 2. Pass the live model as ``geometry=model`` to the
optimizers: :meth:`spectral_optax.GeometryMap.from_nnx` reads the stacked
layouts exactly.

Every block computes ``h + alpha * f(h)``,
``alpha = (base_blocks / num_blocks) ** exponent`` (``exponent=1`` by
default; 0.5: Depth-muP; ``alpha=1.0``: the unscaled baseline); ``absorbed=True`` uses a unit
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

from spectral_optax import attention_max_logits, residual_alpha
from spectral_optax.expert import MAX_LOGITS, scale_init
from spectral_optax.nn._sharded import gathered_call, rows_sharding
from spectral_optax.nn.linen import _check_qkv, _multiplier_and_out_scale

Initializer = Callable[..., Any]
default_kernel_init = nnx.initializers.lecun_normal()
default_embed_init = nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)

# Twins kept on purpose: each module spells out its ``__init__`` (the arguments of its Linen twin's attributes,
# in the same order) and creates its parameters there, where the Linen twin declares them in ``__call__``; a
# shared ``__init__`` would hide each module's arguments from its signature and docs. The rules are shared
# (``_multiplier_and_out_scale``, ``_check_qkv``, ``residual_alpha``) and the arguments' docs (``_SHARED_ARGS``).


#: What the arguments every NNX module here shares mean, written once: :func:`_shares_args` appends the
#: lines to each module's ``Args:`` (the Linen twins document the same names as attributes).
_SHARED_ARGS = {
    "base_blocks": "``K_base``; ``alpha = (base_blocks / num_blocks) ** exponent`` unless ``alpha`` is given.",
    "alpha": "branch multiplier used instead of the rule (``1.0``: the unscaled baseline).",
    "exponent": "``a`` of the rule (1: inverse depth; 0.5: Depth-muP's ``1 / sqrt(K)``).",
    "dtype": "computation dtype (``None``: inferred from the inputs and parameters).",
    "param_dtype": "dtype of the parameters.",
    "rngs": "``nnx.Rngs`` of the initialization.",
}


def _shares_args(*names: str):
    """Class decorator: ``names``' descriptions from :data:`_SHARED_ARGS` appended to the docstring's ``Args:``
    (its last section)."""

    def document(cls):
        doc = (cls.__doc__ or "").rstrip()
        cls.__doc__ = doc + "".join(f"\n      {n}: {_SHARED_ARGS[n]}" for n in names) + "\n    "
        return cls

    return document


def _dense_pair(features: int, hidden: int, kernel_init, out_scale: float, kw: dict):
    """A branch's ``dense_0`` (``features -> hidden``) and ``dense_1`` (``hidden -> features``, kernel and bias
    init times ``out_scale``), made in that order (the order the ``rngs`` are drawn in)."""
    dense_0 = nnx.Linear(features, hidden, kernel_init=kernel_init, **kw)
    dense_1 = nnx.Linear(
        hidden,
        features,
        kernel_init=scale_init(kernel_init, out_scale),
        bias_init=scale_init(nnx.initializers.zeros_init(), out_scale),
        **kw,
    )
    return dense_0, dense_1


@_shares_args("dtype", "param_dtype", "rngs")
class ResidualMLPBlock(nnx.Module):
    """``h + multiplier * dense_1(relu(dense_0(h)))``; ``dense_1`` init times ``out_scale``.

    Args:
      features: input and output width (the residual stream width).
      hidden_features: inner width of the branch, the output width of ``dense_0`` (``None``: ``features``).
      multiplier: branch multiplier ``m`` of ``h + m * f(h)``.
      out_scale: factor on the init of ``dense_1`` (kernel and bias).
      kernel_init: initializer of both kernels (``dense_1``'s times ``out_scale``).
    """

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
        self.dense_0, self.dense_1 = _dense_pair(features, hidden, kernel_init, out_scale, kw)

    def __call__(self, h):
        y = self.dense_1(jax.nn.relu(self.dense_0(h)))
        return h + jnp.asarray(self.multiplier, y.dtype) * y


@_shares_args("dtype", "param_dtype", "rngs")
class MLPBranch(nnx.Module):
    """``dense_1(gelu(dense_0(h)))``: the transformer's MLP branch.

    Args:
      features: input and output width (the residual stream width).
      hidden_features: inner width, the output width of ``dense_0``.
      out_scale: factor on the init of ``dense_1`` (kernel and bias).
      kernel_init: initializer of both kernels (``dense_1``'s times ``out_scale``).
    """

    def __init__(
        self,
        features,
        hidden_features,
        *,
        out_scale=1.0,
        kernel_init=default_kernel_init,
        dtype=None,
        param_dtype=jnp.float32,
        rngs,
    ):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dense_0, self.dense_1 = _dense_pair(features, hidden_features, kernel_init, out_scale, kw)

    def __call__(self, h):
        return self.dense_1(jax.nn.gelu(self.dense_0(h)))


def _recording_attention(query, key, value, mask=None, dtype=None, precision=None, module=None, **kwargs):
    """``nnx.dot_product_attention`` that sows the per-head max logits into ``module``
    (an ``nnx.Intermediate`` named ``max_logits``, read with ``nnx.capture``)."""
    if module is not None:
        module.sow(nnx.Intermediate, MAX_LOGITS, attention_max_logits(query, key, mask))
    return nnx.dot_product_attention(query, key, value, mask=mask, dtype=dtype, precision=precision)


@_shares_args("dtype", "param_dtype", "rngs")
class FusedSelfAttention(nnx.Module):
    """Self-attention with one fused ``qkv`` Linear (``features -> 3 features``)
    and ``out`` (LinearGeneral over ``(heads, d_head)``): the twin of
    :class:`spectral_optax.nn.linen.FusedSelfAttention`, same parameter paths; ``record_max_logits``
    sows the per-head max logits (``nnx.Intermediate`` ``max_logits``, under ``nnx.capture``).

    Args:
      features: input and output width; ``qkv`` maps it to ``3 * features``.
      num_heads: attention heads, ``d_head = features / num_heads`` (``ValueError`` unless it divides ``features``).
      kernel_init: initializer of the ``qkv`` kernel.
      out_kernel_init: initializer of the ``out`` kernel.
      record_max_logits: sow the per-head max logits, shape ``(num_heads,)``, at every call.
    """

    def __init__(
        self,
        features: int,
        num_heads: int,
        *,
        kernel_init=default_kernel_init,
        out_kernel_init=default_kernel_init,
        record_max_logits: bool = False,
        dtype=None,
        param_dtype=jnp.float32,
        rngs,
    ):
        if features % num_heads:
            raise ValueError(f"features={features} is not divisible by num_heads={num_heads}")
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.num_heads = num_heads
        self.dtype = dtype
        self.record_max_logits = record_max_logits
        self.qkv = nnx.Linear(features, 3 * features, kernel_init=kernel_init, **kw)
        self.out = nnx.LinearGeneral(
            (num_heads, features // num_heads), features, axis=(-2, -1), kernel_init=out_kernel_init, **kw
        )

    def __call__(self, x, mask=None):
        d = x.shape[-1]
        qkv = self.qkv(x).reshape(x.shape[:-1] + (3, self.num_heads, d // self.num_heads))
        if self.record_max_logits:
            self.sow(nnx.Intermediate, MAX_LOGITS, attention_max_logits(qkv[..., 0, :, :], qkv[..., 1, :, :], mask))
        y = nnx.dot_product_attention(
            qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :], mask=mask, dtype=self.dtype
        )
        return self.out(y)


@_shares_args("dtype", "param_dtype", "rngs")
class TransformerBlock(nnx.Module):
    """Pre-LN block: ``h += m * attn(ln_attn(h))``; ``h += m * mlp(ln_mlp(h))``.

    ``qkv='split'`` uses ``nnx.MultiHeadAttention`` (``attn/{query,key,value,out}``),
    ``qkv='fused'`` :class:`FusedSelfAttention` (``attn/{qkv,out}``). ``record_max_logits=True``:
    the attention sows its per-head max logits (``attn/max_logits``; off by default, no cost when off).

    Args:
      features: residual width.
      num_heads: attention heads (must divide ``features``).
      mlp_ratio: inner width of the MLP branch, ``mlp_ratio * features``.
      multiplier: branch multiplier ``m`` of both branches.
      out_scale: factor on the init of the branch-last layers ``attn/out`` and ``mlp/dense_1``.
      causal: apply a causal mask (inputs ``(batch, seq, features)``).
      qkv: ``'split'`` (``attn/{query,key,value,out}``) or ``'fused'`` (``attn/{qkv,out}``).
      record_max_logits: the attention sows its per-head max logits (``attn/max_logits``).
      kernel_init: initializer of every kernel (``attn/out`` and ``mlp/dense_1`` times ``out_scale``).
    """

    def __init__(
        self,
        features: int,
        num_heads: int,
        *,
        mlp_ratio: int = 4,
        multiplier: float = 1.0,
        out_scale: float = 1.0,
        causal: bool = True,
        qkv: str = "split",
        record_max_logits: bool = False,
        kernel_init: Initializer = default_kernel_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.multiplier = multiplier
        self.causal = causal
        self.record_max_logits = record_max_logits
        self.ln_attn = nnx.LayerNorm(features, **kw)
        out_init = scale_init(kernel_init, out_scale)
        self.attn: nnx.Module
        if _check_qkv(qkv) == "fused":
            self.attn = FusedSelfAttention(
                features,
                num_heads,
                kernel_init=kernel_init,
                out_kernel_init=out_init,
                record_max_logits=record_max_logits,
                **kw,
            )
        else:
            rec: dict[str, Any] = {"attention_fn": _recording_attention} if record_max_logits else {}
            self.attn = nnx.MultiHeadAttention(
                num_heads=num_heads,
                in_features=features,
                kernel_init=kernel_init,
                out_kernel_init=out_init,
                decode=False,
                deterministic=True,
                **rec,
                **kw,
            )
        self.ln_mlp = nnx.LayerNorm(features, **kw)
        self.mlp = MLPBranch(features, mlp_ratio * features, out_scale=out_scale, kernel_init=kernel_init, **kw)

    def __call__(self, h):
        m = jnp.asarray(self.multiplier, h.dtype)
        mask = nnx.make_causal_mask(jnp.ones(h.shape[:-1], jnp.int32)) if self.causal else None
        if self.record_max_logits and isinstance(self.attn, nnx.MultiHeadAttention):
            h = h + m * self.attn(self.ln_attn(h), mask=mask, sow_weights=True)
        else:
            h = h + m * self.attn(self.ln_attn(h), mask=mask)
        return h + m * self.mlp(self.ln_mlp(h))


def _embed(table: nnx.Embed, ids):
    """``table(ids)``; on an Explicit mesh the rows come back sharded like ``ids``, features
    replicated (:func:`~spectral_optax.nn._sharded.rows_sharding`)."""
    return table(ids, out_sharding=rows_sharding(table.embedding[...], ids))


def _stacked(make_block: Callable[[nnx.Rngs], nnx.Module], num_blocks: int, rngs: nnx.Rngs):
    @nnx.split_rngs(splits=num_blocks)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(r):
        return make_block(r)

    return create(rngs)


def _scan_apply(blocks, h):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def step(x, block):
        return gathered_call(block, x)

    return step(h, blocks)


def _set_blocks(model: nnx.Module, make_block, num_blocks: int, scan: bool, rngs: nnx.Rngs):
    """``model.blocks`` (stacked, layer axis 0) or ``model.blocks_0 .. blocks_{K-1}``
    (the Linen ``scan=False`` paths)."""
    setattr(model, "scan", scan)  # noqa: B010 - any nnx.Module (mypy)
    setattr(model, "num_blocks", num_blocks)  # noqa: B010
    if scan:
        setattr(model, "blocks", _stacked(make_block, num_blocks, rngs))  # noqa: B010
    else:
        for k in range(num_blocks):
            setattr(model, f"blocks_{k}", make_block(rngs))


def _apply_blocks(model: nnx.Module, h):
    if getattr(model, "scan"):  # noqa: B009
        return _scan_apply(getattr(model, "blocks"), h)  # noqa: B009
    for k in range(getattr(model, "num_blocks")):  # noqa: B009
        h = gathered_call(getattr(model, f"blocks_{k}"), h)
    return h


@_shares_args("base_blocks", "alpha", "exponent", "dtype", "param_dtype", "rngs")
class ResidualMLP(nnx.Module):
    """Residual MLP: ``input_proj`` (after ``embed`` for byte/token inputs),
    K stacked :class:`ResidualMLPBlock` (``h + alpha * f(h)``), ``head``.

    Args:
      in_features: input width (with ``vocab_size``: the number of tokens per input).
      features: residual width.
      num_blocks: ``K``, the number of blocks.
      out_features: head width (classes / vocabulary).
      absorbed: unit multiplier; the init of ``dense_1`` (kernel and bias) times ``alpha``.
      hidden_features: branch inner width (``None``: ``features``).
      vocab_size: if set, integer inputs ``(..., in_features)`` are embedded (``embed``, width ``features``)
        and flattened to ``in_features * features`` before ``input_proj``.
      kernel_init: initializer of every kernel (``input_proj``, the blocks', ``head``).
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
        exponent: float = 1.0,
        absorbed: bool = False,
        hidden_features: int | None = None,
        vocab_size: int | None = None,
        kernel_init: Initializer = default_kernel_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        a = residual_alpha(num_blocks, base_blocks, alpha=alpha, exponent=exponent)
        self.branch_alpha = a
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.vocab_size = vocab_size
        d_in = in_features
        if vocab_size is not None:
            self.embed = nnx.Embed(vocab_size, features, rngs=rngs, **kw)
            d_in = in_features * features
        self.input_proj = nnx.Linear(d_in, features, kernel_init=kernel_init, rngs=rngs, **kw)
        mult, out_scale = _multiplier_and_out_scale(a, absorbed)
        self.blocks = _stacked(
            lambda r: ResidualMLPBlock(
                features, hidden_features, multiplier=mult, out_scale=out_scale, kernel_init=kernel_init, rngs=r, **kw
            ),
            num_blocks,
            rngs,
        )
        self.head = nnx.Linear(features, out_features, kernel_init=kernel_init, rngs=rngs, **kw)

    def __call__(self, x):
        if self.vocab_size is not None:
            x = _embed(self.embed, x)
            x = x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))
        h = _scan_apply(self.blocks, gathered_call(self.input_proj, x))
        return gathered_call(self.head, h)


@_shares_args("base_blocks", "alpha", "exponent", "dtype", "param_dtype", "rngs")
class Transformer(nnx.Module):
    """Decoder-only pre-LN transformer LM (GPT-style): ``embed`` + ``pos_embed``
    -> K :class:`TransformerBlock` -> ``ln_final`` -> untied ``head``.

    The twin of :class:`spectral_optax.nn.linen.Transformer` (same parameter
    paths, same function): ``scan=True`` stacks the blocks (``blocks/...``
    with a leading layer axis), ``scan=False`` keeps ``blocks_0 ..``;
    ``qkv='split' | 'fused'``; ``embedding_init`` for both tables; ``record_max_logits``: every
    attention sows its per-head max logits (``nnx.capture(model, nnx.Intermediate)``, then
    :func:`spectral_optax.collect_max_logits`).

    Args:
      vocab_size: vocabulary size: rows of ``embed``, width of ``head``.
      features: residual width.
      num_blocks: ``K``, the number of blocks.
      num_heads: attention heads per block (must divide ``features``).
      max_len: rows of ``pos_embed``, the longest sequence accepted.
      mlp_ratio: inner width of the MLP branches, ``mlp_ratio * features``.
      absorbed: unit multiplier; the init of ``attn/out`` and ``mlp/dense_1`` times ``alpha``.
      scan: one ``blocks`` stack with a leading layer axis (``True``) or ``blocks_0 .. blocks_{K-1}``.
      qkv: ``'split'`` or ``'fused'`` attention projections (see :class:`TransformerBlock`).
      record_max_logits: every attention sows its per-head max logits.
      kernel_init: initializer of every kernel (``head`` and the blocks').
      embedding_init: initializer of ``embed`` and ``pos_embed`` (default: normal, variance ``1 / features``).
    """

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
        exponent: float = 1.0,
        absorbed: bool = False,
        scan: bool = True,
        qkv: str = "split",
        record_max_logits: bool = False,
        kernel_init: Initializer = default_kernel_init,
        embedding_init: Initializer = default_embed_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        a = residual_alpha(num_blocks, base_blocks, alpha=alpha, exponent=exponent)
        self.branch_alpha = a
        self.max_len = max_len
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.embed = nnx.Embed(vocab_size, features, embedding_init=embedding_init, rngs=rngs, **kw)
        self.pos_embed = nnx.Embed(max_len, features, embedding_init=embedding_init, rngs=rngs, **kw)
        mult, out_scale = _multiplier_and_out_scale(a, absorbed)
        _set_blocks(
            self,
            lambda r: TransformerBlock(
                features,
                num_heads,
                mlp_ratio=mlp_ratio,
                multiplier=mult,
                out_scale=out_scale,
                qkv=qkv,
                record_max_logits=record_max_logits,
                kernel_init=kernel_init,
                rngs=r,
                **kw,
            ),
            num_blocks,
            scan,
            rngs,
        )
        self.ln_final = nnx.LayerNorm(features, rngs=rngs, **kw)
        self.head = nnx.Linear(features, vocab_size, kernel_init=kernel_init, rngs=rngs, **kw)

    def __call__(self, tokens):
        if tokens.shape[-1] > self.max_len:
            raise ValueError(f"sequence length {tokens.shape[-1]} exceeds max_len={self.max_len}")
        h = _embed(self.embed, tokens) + _embed(self.pos_embed, jnp.arange(tokens.shape[-1]))
        h = _apply_blocks(self, h)
        return gathered_call(self.head, gathered_call(self.ln_final, h))


@_shares_args("dtype", "param_dtype", "rngs")
class ResNetBlock(nnx.Module):
    """Twin of :class:`spectral_optax.nn.linen.ResNetBlock` (same paths and function).

    Args:
      features: channels of the input and the output (3x3 convolutions, constant width and resolution).
      multiplier: branch multiplier ``m`` of ``h + m * f(h)``.
      out_scale: factor on the init of ``conv_1`` (kernel and bias).
      kernel_init: initializer of both conv kernels (``conv_1``'s times ``out_scale``).
    """

    def __init__(
        self,
        features: int,
        *,
        multiplier: float = 1.0,
        out_scale: float = 1.0,
        kernel_init: Initializer = default_kernel_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.multiplier = multiplier
        self.ln_0 = nnx.LayerNorm(features, **kw)
        self.conv_0 = nnx.Conv(features, features, (3, 3), kernel_init=kernel_init, **kw)
        self.ln_1 = nnx.LayerNorm(features, **kw)
        self.conv_1 = nnx.Conv(
            features,
            features,
            (3, 3),
            kernel_init=scale_init(kernel_init, out_scale),
            bias_init=scale_init(nnx.initializers.zeros_init(), out_scale),
            **kw,
        )

    def __call__(self, h):
        y = self.conv_1(jax.nn.relu(self.ln_1(self.conv_0(jax.nn.relu(self.ln_0(h))))))
        return h + jnp.asarray(self.multiplier, y.dtype) * y


@_shares_args("base_blocks", "alpha", "exponent", "dtype", "param_dtype", "rngs")
class ResNet(nnx.Module):
    """Twin of :class:`spectral_optax.nn.linen.ResNet` (same paths and function):
    ``conv_in``, ``num_stages`` stages of K :class:`ResNetBlock` at widths
    ``features * 2**s`` with stride-2 ``conv_down_{s}`` between them,
    ``ln_final``, global average pooling, ``head``.

    Args:
      in_channels: channels ``C`` of the input images ``(batch, H, W, C)``.
      features: width of stage 0 (the stages: ``features * 2**s``).
      num_blocks: ``K``, blocks per stage.
      num_classes: head width.
      absorbed: unit multiplier; the init of every block's ``conv_1`` (kernel and bias) times ``alpha``.
      kernel_init: initializer of every kernel (the convolutions', ``head``).
      num_stages: stages (default three, as the Linen twin).
    """

    def __init__(
        self,
        in_channels: int,
        features: int,
        num_blocks: int,
        num_classes: int,
        *,
        base_blocks: int = 2,
        alpha: float | None = None,
        exponent: float = 1.0,
        absorbed: bool = False,
        kernel_init: Initializer = default_kernel_init,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
        num_stages: int = 3,
    ):
        a = residual_alpha(num_blocks, base_blocks, alpha=alpha, exponent=exponent)
        self.branch_alpha = a
        self.num_blocks = num_blocks
        self.num_stages = num_stages
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        mult, out_scale = _multiplier_and_out_scale(a, absorbed)
        self.conv_in = nnx.Conv(in_channels, features, (3, 3), kernel_init=kernel_init, **kw)
        for s in range(num_stages):
            width = features * 2**s
            if s:
                setattr(
                    self,
                    f"conv_down_{s}",
                    nnx.Conv(width // 2, width, (3, 3), strides=(2, 2), kernel_init=kernel_init, **kw),
                )
            for k in range(num_blocks):
                setattr(
                    self,
                    f"stage_{s}_blocks_{k}",
                    ResNetBlock(width, multiplier=mult, out_scale=out_scale, kernel_init=kernel_init, **kw),
                )
        last = features * 2 ** (num_stages - 1)
        self.ln_final = nnx.LayerNorm(last, **kw)
        self.head = nnx.Linear(last, num_classes, kernel_init=kernel_init, **kw)

    def __call__(self, x):
        if x.ndim != 4:
            raise ValueError(f"ResNet expects images (batch, H, W, C), got shape {x.shape}")
        h = self.conv_in(x)
        for s in range(self.num_stages):
            if s:
                h = getattr(self, f"conv_down_{s}")(h)
            for k in range(self.num_blocks):
                h = getattr(self, f"stage_{s}_blocks_{k}")(h)
        return self.head(jax.nn.relu(self.ln_final(h)).mean(axis=(1, 2)))


# The NNX twins of spectral_optax.nn.linen's modules, listed as there (deliberately the same names: one
# model, two Flax APIs, the same parameter paths).
__all__ = [
    "MLPBranch",
    "ResidualMLPBlock",
    "FusedSelfAttention",
    "TransformerBlock",
    "ResidualMLP",
    "Transformer",
    "ResNetBlock",
    "ResNet",
]
