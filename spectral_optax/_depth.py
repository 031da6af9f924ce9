"""Depth transfer: inverse-depth residual scaling, in explicit and absorbed form.

A residual network ``h_{k+1} = h_k + alpha * f_k(h_k)``, ``k = 1..K``, with

    alpha = (K_base / K) ** a     (K_base = ``base_blocks``, default 2;
                                   a = ``exponent``, default 1)

With ``a = 1`` (inverse-depth scaling, the rule of Wong, Xu, Li, Lu 2026 and
of CompleteP) the loss has a Lipschitz constant and an L-smoothness constant
that do not grow with depth, so one learning rate tuned at small depth serves
at large depth for optimizers whose steps are bounded in their norm (Muon,
MOGA, normalized SGD, AdamW up to epsilon). ``a = 1/2`` is Depth-muP's
``1 / sqrt(K)`` branch multiplier.

**The companion learning rate of an exponent** ``a != 1``: the block
parameters' learning rate times :func:`~spectral_optax.expert.depth_lr_multiplier`
(:func:`~spectral_optax.depth_lr_scale`), derived in docs/math.md section 5.

**Explicit form.** The model multiplies each residual branch's output by
``alpha`` (``spectral_optax.nn`` blocks do this by default).

**Absorbed form.** Leave the model unscaled (``h + f(h)``) and instead

  1. initialize each branch's *last* layer (weights and bias) times ``alpha``
     (:func:`~spectral_optax.expert.scale_init` for a Flax initializer, :func:`~spectral_optax.depth_scaled_init` for
     an already initialized parameter tree), and
  2. multiply that layer's updates by ``alpha`` (:func:`~spectral_optax.depth_residual_scale`).

Why this is the same network. Let ``W`` be a branch's last layer in the
explicit form and ``W' = alpha W`` in the absorbed form; every other parameter
is shared and the two networks compute the same function. Then the gradients
are ``G' = dL/dW' = G / alpha`` (and identical for every other parameter), so
an explicit step ``W <- W - eta u(G)`` is reproduced by
``W' <- W' - eta * c * u(G')`` with

  * ``c = alpha`` if ``u`` is scale invariant, ``u(G / alpha) = u(G)``:
    any per-layer normalization of the gradient or of its (linear) momentum,
    e.g. Muon's orthogonalization, MOGA's row normalization, spectral /
    Frobenius-normalized SGD, sign descent, Adam with ``eps -> 0``.
    (``optimizer_kind='scale_invariant'``);
  * ``c = alpha ** 2`` if ``u`` is linear, ``u(G / alpha) = u(G) / alpha``:
    plain SGD, with or without (Nesterov) momentum (``optimizer_kind='sgd'``).

A *global* normalization (a global-norm clip, a global trust ratio) sees
``G / alpha`` in one block and ``G`` in the others, so it is not scale
invariant per layer and the two forms differ.

**Weight decay is not multiplied.** Decoupled decay shrinks ``W`` by the
factor ``(1 - eta * lambda)``; ``W' = alpha W`` shrinks by the same factor, so
the absorbed decay term ``eta * lambda * W'`` must *not* be multiplied by
``alpha``. Put :func:`~spectral_optax.depth_residual_scale` after the optimizer's
normalization and before the decay and the learning rate::

    optax.chain(
        <normalization, e.g. so.scale_by_spectral_norm() / scale_by_muon(...)>,
        so.depth_residual_scale(num_blocks),      # here: update * alpha
        optax.add_decayed_weights(weight_decay),  # after: decay not scaled
        optax.scale_by_learning_rate(learning_rate),
    )

A complete named optimizer (``so.muon``, ``so.moga``, ``so.spectral_sgd``)
ends with ``-learning_rate``; ``depth_residual_scale`` is linear, so it may
follow it, but only with the optimizer's own decay switched off (chained
after a decay it would scale the decay of the selected layers by ``alpha``
too). Add the decay after it with :func:`~spectral_optax.decoupled_weight_decay`::

    optax.chain(
        so.muon(learning_rate, weight_decay=0.0),
        so.depth_residual_scale(num_blocks),
        so.decoupled_weight_decay(learning_rate, weight_decay),  # -lr * wd * W
    )

References:
  Wong, Xu, Li, Lu (2026), inverse-depth residual scaling (docs/math.md
  section 5). Yang, Yu, Zhu, Hayou (2023), Depth-muP (1/sqrt(L) branches,
  Adam LR eta/sqrt(L)); Dey et al. (2025), CompleteP (1/L branches).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from spectral_optax._callables import required_positional
from spectral_optax._geometry import (
    GeometryError,
    GeometryLike,
    label_by_geometry,
    label_by_path,
    path_str,
)

__all__ = [
    "BLOCK_PATTERN",
    "BRANCH_OUT_PATTERN",
    "depth_lr_multiplier",
    "depth_lr_scale",
    "depth_residual_scale",
    "depth_scaled_init",
    "residual_alpha",
    "residual_branch_mask",
    "scale_init",
]

#: Default ``mask``: the last layer of every residual branch of the
#: ``spectral_optax.nn`` models (Linen and NNX, scanned or unrolled):
#: ``blocks/dense_1`` (residual MLP), ``blocks/mlp/dense_1`` and
#: ``blocks/attn/out`` (transformer). Matched with ``re.search`` on the
#: '/'-joined parameter path.
BRANCH_OUT_PATTERN = r"(?i)(^|/)blocks(_\d+)?/((mlp/)?dense_1|attn/out)/(kernel|bias)$"

#: Default ``mask`` of :func:`~spectral_optax.depth_lr_scale`: every parameter of every residual
#: block of the ``spectral_optax.nn`` models (``blocks/...`` scanned,
#: ``blocks_{k}/...`` unrolled, ResNet ``stage_{s}_blocks_{k}/...``); not the
#: embeddings, input projection, stage transitions, final norm or head.
BLOCK_PATTERN = r"(?i)(^|/)(stage_\d+_)?blocks(_\d+)?/"

OPTIMIZER_KINDS = ("scale_invariant", "sgd")

MaskLike = Any  # str | Sequence[str] | Callable[[str, Geometry], bool] | Callable[[params], tree] | tree


def _check_depth(num_blocks, base_blocks, exponent) -> None:
    if int(num_blocks) != num_blocks or num_blocks < 1:
        raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
    if not base_blocks > 0:
        raise ValueError(f"base_blocks must be positive, got {base_blocks!r}")
    try:
        a = float(exponent)
    except (TypeError, ValueError):
        a = float("nan")
    if not (math.isfinite(a) and a >= 0.0):
        raise ValueError(
            f"exponent must be a finite number >= 0, got {exponent!r}: 1 for inverse-depth scaling "
            "(alpha = K_base / K), 0.5 for Depth-muP (alpha = sqrt(K_base / K)), 0 for no scaling."
        )


def residual_alpha(
    num_blocks: int, base_blocks: int = 2, *, alpha: float | None = None, exponent: float = 1.0
) -> float:
    """The branch multiplier ``alpha = (base_blocks / num_blocks) ** exponent``.

    Args:
      num_blocks: ``K``, the number of residual blocks of the network.
      base_blocks: ``K_base``, the depth at which ``alpha = 1`` (the depth the
        learning rate is tuned at; 2 in the paper's residual-MLP runs).
      alpha: an explicit multiplier that wins when given (``1.0``: unscaled).
      exponent: ``a``: 1 (default) for inverse-depth scaling, 0.5 for
        Depth-muP's ``1 / sqrt(K)`` rule (train it with its companion
        learning rate, :func:`~spectral_optax.depth_lr_scale`).
    """
    if alpha is not None:
        return float(alpha)
    _check_depth(num_blocks, base_blocks, exponent)
    return (float(base_blocks) / float(num_blocks)) ** float(exponent)


def depth_lr_multiplier(
    num_blocks: int, base_blocks: int = 2, *, exponent: float = 1.0, optimizer_kind: str = "scale_invariant"
) -> float:
    """The companion learning-rate factor of the block parameters for exponent ``a``.

    ``(K_base / K) ** (1 - a)`` for scale-invariant optimizers (Muon, MOGA,
    normalized SGD, Adam), ``(K_base / K) ** (1 - 2 a)`` for plain SGD; the
    derivation is in docs/math.md section 5. 1 for ``a = 1`` with a
    scale-invariant optimizer: inverse-depth scaling needs no correction.

    Args:
      num_blocks: ``K``, the number of residual blocks.
      base_blocks: ``K_base``, the depth the learning rate was tuned at (the factor is 1 there).
      exponent: ``a`` of the branch multiplier ``alpha = (K_base / K) ** a``.
      optimizer_kind: ``'scale_invariant'`` or ``'sgd'``.
    """
    _check_kind(optimizer_kind)
    _check_depth(num_blocks, base_blocks, exponent)
    power = 1.0 - float(exponent) if optimizer_kind == "scale_invariant" else 1.0 - 2.0 * float(exponent)
    return (float(base_blocks) / float(num_blocks)) ** power


def _check_kind(optimizer_kind: str) -> None:
    if optimizer_kind not in OPTIMIZER_KINDS:
        raise ValueError(
            f"optimizer_kind must be one of {OPTIMIZER_KINDS}, got {optimizer_kind!r}: "
            "'scale_invariant' for Muon / MOGA / spectral SGD / Adam, 'sgd' for plain SGD."
        )


def scale_init(init: Callable, alpha: float) -> Callable:
    """Wrap a Flax/JAX initializer so that it returns ``alpha * init(...)``.

    Use it for the last layer (kernel and bias) of each residual branch to
    build the absorbed form, e.g.
    ``nn.Dense(width, kernel_init=scale_init(nn.initializers.lecun_normal(), alpha))``.
    The product is computed in the initializer's dtype.

    Args:
      init: an initializer ``init(key, shape, dtype) -> array``.
      alpha: the factor (e.g. :func:`~spectral_optax.residual_alpha`).
    """

    def scaled(key, shape, dtype=jnp.float32, *args, **kwargs):
        x = init(key, shape, dtype, *args, **kwargs)
        return (x * jnp.asarray(alpha, dtype=x.dtype)).astype(x.dtype)

    return scaled


# --------------------------------------------------------------------------
# The mask: which leaves are the last layer of a residual branch.
# --------------------------------------------------------------------------


def _is_array(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def residual_branch_mask(mask: MaskLike = BRANCH_OUT_PATTERN, geometry: GeometryLike = None) -> Callable[[Any], Any]:
    """Normalise a ``mask=`` argument into ``params -> tree of bools``.

    Args:
      mask: which parameters are the last layer of a residual branch:
        a regex (or a sequence of regexes) ``re.search``-ed on the '/'-joined
        parameter path; a callable ``(path, geometry) -> bool`` (the leaf's
        :class:`~spectral_optax.Geometry` resolved through ``geometry``); an
        optax-style callable ``params -> tree of bools``; or a tree of bools.
      geometry: how leaves are resolved for a ``(path, geometry)`` callable;
        see :func:`spectral_optax.as_geometry_map`.
    """
    if isinstance(mask, str) or (isinstance(mask, Sequence) and mask and all(isinstance(m, str) for m in mask)):
        patterns = [re.compile(m) for m in ([mask] if isinstance(mask, str) else mask)]

        return label_by_path(lambda path: any(p.search(path) for p in patterns))
    if callable(mask):
        if required_positional(mask) == 2:
            return label_by_geometry(lambda path, g: bool(mask(path, g)), geometry)
        return mask
    return lambda params: mask


def _selected_paths(mask_fn, params) -> tuple[list[str], list[str]]:
    labels = mask_fn(params)
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    try:
        flat_labels = jax.tree_util.tree_structure(params).flatten_up_to(labels)  # type: ignore[attr-defined]
    except (ValueError, TypeError) as e:
        raise GeometryError(
            "depth_residual_scale: the mask tree does not have the structure of the parameters "
            f"({e}). Pass mask= as a regex on the '/'-joined path instead."
        ) from e
    chosen = [path_str(k) for (k, x), m in zip(flat, flat_labels) if m and _is_array(x)]
    everything = [path_str(k) for k, x in flat if _is_array(x)]
    return chosen, everything


def _check_selection(mask_fn, params, where: str):
    chosen, everything = _selected_paths(mask_fn, params)
    if not chosen:
        shown = "\n    ".join(everything[:12]) + ("\n    ..." if len(everything) > 12 else "")
        raise GeometryError(
            f"{where}: the mask selects no parameter, so nothing would be scaled. The parameter "
            f"paths are:\n    {shown}\nPass mask= a regex matching the last layer (kernel and "
            "bias) of each residual branch, e.g. mask=r'blocks/.*/out_proj/(kernel|bias)$', or "
            "a callable (path, geometry) -> bool."
        )
    return chosen


# --------------------------------------------------------------------------
# Absorbed init.
# --------------------------------------------------------------------------
def depth_scaled_init(
    params,
    num_blocks: int,
    base_blocks: int = 2,
    *,
    exponent: float = 1.0,
    mask: MaskLike = BRANCH_OUT_PATTERN,
    geometry: GeometryLike = None,
):
    """Absorbed-form init: multiply the selected (branch-last-layer) params by alpha.

    ``W' = alpha * W`` and ``b' = alpha * b`` with
    ``alpha = (base_blocks / num_blocks) ** exponent``, so that a network with
    unit branch multipliers computes exactly what the explicit
    ``h + alpha * f(h)`` network computes with ``W, b``. Dtypes are preserved.

    Args:
      params: a freshly initialized parameter tree (Linen dict or nnx.State).
      num_blocks: ``K``, the number of residual blocks.
      base_blocks: ``K_base``, the depth at which ``alpha = 1``.
      exponent: ``a`` of ``alpha = (K_base / K) ** a`` (see :func:`~spectral_optax.residual_alpha`).
      mask: the branch-last layers; see ``residual_branch_mask``.
      geometry: only used by a ``(path, geometry)`` mask.

    Returns:
      The parameter tree with the selected leaves multiplied by alpha.
    """
    alpha = residual_alpha(num_blocks, base_blocks, exponent=exponent)
    mask_fn = residual_branch_mask(mask, geometry)
    _check_selection(mask_fn, params, "depth_scaled_init")
    labels = mask_fn(params)
    return jax.tree_util.tree_map(
        lambda x, m: (x * jnp.asarray(alpha, x.dtype)).astype(x.dtype) if m and _is_array(x) else x,
        params,
        labels,
    )


# --------------------------------------------------------------------------
# The gradient transformation.
# --------------------------------------------------------------------------
def depth_residual_scale(
    num_blocks: int,
    base_blocks: int = 2,
    *,
    exponent: float = 1.0,
    mask: MaskLike = BRANCH_OUT_PATTERN,
    geometry: GeometryLike = None,
    optimizer_kind: str = "scale_invariant",
) -> optax.GradientTransformationExtraArgs:
    """Absorbed inverse-depth residual scaling as a gradient transformation.

    Multiplies the updates of each residual branch's last layer (selected by
    ``mask``) by

      * ``alpha = (base_blocks / num_blocks) ** exponent`` for scale-invariant optimizers
        (``optimizer_kind='scale_invariant'``: Muon, MOGA, spectral /
        normalized SGD, sign descent, Adam up to epsilon), placed *after*
        the normalization;
      * ``alpha ** 2`` for plain SGD (``optimizer_kind='sgd'``, with or
        without momentum), anywhere in the (linear) chain before the decay.

    and leaves every other update unchanged. Combined with the absorbed init
    (:func:`~spectral_optax.depth_scaled_init` / :func:`~spectral_optax.expert.scale_init`) and unit branch
    multipliers this reproduces the explicit ``h + alpha * f(h)`` network step
    for step (see the module docstring for the derivation).

    Chain order: normalization -> ``depth_residual_scale`` ->
    ``optax.add_decayed_weights`` -> ``optax.scale_by_learning_rate``. Weight
    decay must come after this transform: the absorbed layer decays by the
    same factor as the explicit one, not by alpha times it.

    Args:
      num_blocks: ``K``, the number of residual blocks.
      base_blocks: ``K_base`` (default 2): the depth where ``alpha = 1``.
      exponent: ``a`` of ``alpha = (K_base / K) ** a`` (default 1; 0.5 for
        Depth-muP, with :func:`~spectral_optax.depth_lr_scale` for its learning rate).
      mask: the last layer (kernel and bias) of every residual branch: a
        regex on the '/'-joined path (default :data:`~spectral_optax.expert.BRANCH_OUT_PATTERN`, the
        ``spectral_optax.nn`` naming), a sequence of regexes, a callable
        ``(path, geometry) -> bool``, an optax-style ``params -> tree of
        bools`` or a tree of bools.
      geometry: resolves each leaf's :class:`~spectral_optax.Geometry` for a
        ``(path, geometry)`` mask; see :func:`spectral_optax.as_geometry_map`.
      optimizer_kind: ``'scale_invariant'`` (factor alpha) or ``'sgd'``
        (factor alpha**2).

    Returns:
      An ``optax.GradientTransformation`` with an empty state. The update
      dtype of every leaf is preserved.

    Raises:
      GeometryError: at ``init`` if the mask selects no parameter (the
        message lists the parameter paths).

    References:
      Wong, Xu, Li, Lu (2026); docs/math.md section 5 (absorbed form).
    """
    _check_kind(optimizer_kind)
    alpha = residual_alpha(num_blocks, base_blocks, exponent=exponent)
    factor = alpha if optimizer_kind == "scale_invariant" else alpha**2
    return _scale_selected(factor, residual_branch_mask(mask, geometry), "depth_residual_scale")


def depth_lr_scale(
    num_blocks: int,
    base_blocks: int = 2,
    *,
    exponent: float,
    mask: MaskLike = BLOCK_PATTERN,
    geometry: GeometryLike = None,
    optimizer_kind: str = "scale_invariant",
) -> optax.GradientTransformationExtraArgs:
    """The companion learning rate of a residual-scale exponent, as a gradient transformation.

    Multiplies the updates of every block parameter (selected by ``mask``) by
    :func:`~spectral_optax.expert.depth_lr_multiplier`, ``(K_base / K) ** (1 - a)`` for
    scale-invariant optimizers (``(K_base / K) ** (1 - 2 a)`` for SGD), and
    leaves the others (embeddings, head, final norm) unchanged: a per-layer
    learning-rate multiplier, so it goes *after* the complete optimizer
    (decay included: a learning rate multiplies the decoupled decay too)::

        optax.chain(so.muon(lr), so.depth_lr_scale(K, exponent=0.5))

    With the network's branches multiplied by ``sqrt(K_base / K)``
    (``exponent=0.5``, e.g. ``so.nn.linen.Transformer(..., exponent=0.5)``)
    this is Depth-muP; with ``exponent=1`` the factor is 1 (scale-invariant).

    Args:
      num_blocks: ``K``, the number of residual blocks.
      base_blocks: ``K_base`` (default 2): the depth where the factor is 1.
      exponent: ``a`` of the branch multiplier ``alpha = (K_base / K) ** a``.
      mask: the block parameters: a regex on the '/'-joined path (default
        :data:`~spectral_optax.expert.BLOCK_PATTERN`), or any ``mask`` of :func:`~spectral_optax.depth_residual_scale`.
      geometry: resolves each leaf's geometry for a ``(path, geometry)`` mask.
      optimizer_kind: ``'scale_invariant'`` or ``'sgd'``.

    Returns:
      An ``optax.GradientTransformation`` with an empty state; update dtypes
      are preserved.

    Raises:
      GeometryError: at ``init`` if the mask selects no parameter.
    """
    factor = depth_lr_multiplier(num_blocks, base_blocks, exponent=exponent, optimizer_kind=optimizer_kind)
    return _scale_selected(factor, residual_branch_mask(mask, geometry), "depth_lr_scale")


def _scale_selected(factor: float, mask_fn, where: str) -> optax.GradientTransformationExtraArgs:
    """Multiply the updates of the leaves ``mask_fn`` selects by ``factor`` (empty state)."""

    def init_fn(params):
        if jax.tree_util.tree_leaves(params):  # not optax.tree_map_params' empty placeholder
            _check_selection(mask_fn, params, where)
        return optax.EmptyState()

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        labels = mask_fn(updates)

        def scale(u, m):
            if m and _is_array(u):
                return (u * jnp.asarray(factor, u.dtype)).astype(u.dtype)
            return u

        return jax.tree_util.tree_map(scale, updates, labels), state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
