"""MOGA (row/column-normalized momentum) and rescaled AdamW.

MOGA is steepest descent under per-layer (p,mean) -> inf operator norms
(docs/math.md section 3): the momentum of each hidden matrix is replaced by
its dual direction under that norm, whose size does not depend on width, so
one learning rate serves every width (and, with inverse-depth residual
scaling, every depth).

References:
  Wong, Xu, Li, Lu (2026), inverse-depth residual scaling and MOGA
  (GPT-2 with p in {1.5, 2, 2.5}); Large, Bernstein et al. (2024), "Scalable
  Optimization in the Modular Norm"; Yang et al. (2022), "Tensor Programs V"
  (muP Adam: hidden and output LR proportional to 1/fan_in).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import optax

from spectral_optax._duals.row_column import check_p
from spectral_optax._geometry import (
    Geometry,
    GeometryLike,
    as_geometry_map,
    label_by_geometry,
    map_with_geometry,
)
from spectral_optax._numerics import static_value
from spectral_optax._optimizers.common import geometry_partition, optax_aliases, train_float_leaves
from spectral_optax._transforms.momentum import ema_momentum
from spectral_optax._transforms.row_column import (
    scale_by_column_norm,
    scale_by_row_norm,
    scale_by_sign,
)
from spectral_optax._transforms.weight_decay import decay_then_learning_rate

__all__ = ["MOGA_RULES", "moga", "moga_labels", "rescaled_adamw"]

#: Per-leaf rules understood by :func:`~spectral_optax.moga` (values of ``rules=``).
MOGA_RULES = ("row", "col", "head", "sign", "adam")


def _default_rule(geom: Geometry, variant: str) -> str:
    if geom.kind == "matrix":
        return "head" if geom.role == "output" else variant
    return "sign"  # embeddings, biases, norm scales, and 'elementwise' leaves (no rule decided them)


def _rule_name(rule: Any) -> Any:
    """``'adamw'`` (muon's spelling of the Adam route) is ``'adam'``."""
    return "adam" if rule == "adamw" else rule


def _route_fn(
    variant: str, rules: Mapping[str, Any] | None, by_kind: Mapping[str, Any] | None = None
) -> Callable[[str, Geometry], str]:
    compiled = [(re.compile(k), k, v) for k, v in (rules or {}).items()]
    by_kind = {k: v for k, v in (by_kind or {}).items() if v is not None}

    def route_of(path: str, geom: Geometry) -> str:
        for pattern, key, rule in compiled:
            if pattern.search(path):
                return _rule_name(rule) if isinstance(rule, str) else f"custom:{key}"
        kind = "output" if geom.kind == "matrix" and geom.role == "output" else geom.kind
        if kind in by_kind:
            rule = by_kind[kind]
            return _rule_name(rule) if isinstance(rule, str) else f"custom:{kind}"
        return _default_rule(geom, variant)

    return route_of


def moga_labels(
    *, variant: str = "row", rules: Mapping[str, Any] | None = None, geometry: GeometryLike = None
) -> Callable[[Any], Any]:
    """``params -> tree of rule names`` used by :func:`~spectral_optax.moga` (for inspection).

    Per leaf: the first regex of ``rules`` that ``re.search``-es the
    '/'-joined path wins; otherwise hidden matrices get ``variant``, output
    matrices (role ``'output'``) ``'head'``, embeddings and vectors ``'sign'``.
    A rule given as a GradientTransformation is labelled ``'custom:<regex>'``.

    Args:
      variant: ``'row'`` or ``'col'``: the label of hidden matrices.
      rules: ``{regex: rule}`` per-path overrides, as in :func:`~spectral_optax.moga`.
      geometry: see :func:`spectral_optax.as_geometry_map`.

    Returns:
      a function ``params -> tree`` of the same structure holding each leaf's
      rule name (one of ``MOGA_RULES`` or ``'custom:<regex>'``).
    """
    return label_by_geometry(_route_fn(variant, rules), as_geometry_map(geometry))


@optax_aliases(beta="momentum", eps="adam_eps", mask="weight_decay_mask")
def moga(
    learning_rate: optax.ScalarOrSchedule,
    p: float = 2.0,
    *,
    variant: str = "row",
    q: Any = None,
    base_factor: float = 25.0,
    head_base_width: float | None = None,
    momentum: float = 0.95,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    rules: Mapping[str, Any] | None = None,
    embedding: str | optax.GradientTransformation | None = None,
    vector: str | optax.GradientTransformation | None = None,
    output: str | optax.GradientTransformation | None = None,
    geometry: GeometryLike = None,
    adam_b2: float = 0.999,
    adam_eps: float = 1e-8,
    mu_dtype: Any = None,
    axis_name: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """MOGA: EMA momentum, normalized per leaf in its operator norm.

    With ``mu <- momentum * mu + (1 - momentum) * g`` per leaf, the update is
    ``-learning_rate * (D(mu) + weight_decay * W)`` where ``D`` is, by rule:

    * ``'row'`` (hidden matrices, ``variant='row'``): ``base_factor *``
      the (p,mean)->inf dual: per fan-out index ``i`` (each output neuron),
      ``sign(mu_i) |mu_i|^(p-1) / ||mu_i||_p^(p-1) * d_in^(-1/p)``
      (:func:`~spectral_optax.scale_by_row_norm`);
    * ``'col'`` (hidden matrices, ``variant='col'``): ``base_factor *`` the
      (1,mean)->(q,mean) dual, per fan-in index ``j``
      ``sign(h_j) |h_j|^(q*-1) / ||h_j||_{q*}^(q*-1) * d_out^(1/q) / d_in``
      (:func:`~spectral_optax.scale_by_column_norm`);
    * ``'head'`` (matrices with role ``'output'``): the row direction without
      fan scaling and without ``base_factor`` (unit ``l_{p*}`` fan-in vectors,
      as published); with ``head_base_width = W`` it is the row direction with
      fan scaling times ``W^(1/p)``, i.e. fan-in vectors of ``l_{p*}`` norm
      ``(W / d_in)^(1/p)``: the published head at fan-in ``W`` and, at any
      width, a logit change that does not grow with ``d_in`` (docs/math.md
      section 3, "MOGA's head and width");
    * ``'sign'`` (embeddings, biases, norm scales, and leaves no geometry
      rule decides, kind ``'elementwise'``): ``sign(mu)``;
    * ``'adam'`` (only by request): Adam with ``b1=momentum``, ``adam_b2``,
      ``adam_eps`` and ``nesterov`` (``optax.scale_by_adam``'s Nesterov form)
      at the same learning rate.

    A fused QKV kernel declared with ``fan_out_splits=3`` in the geometry is
    normalized as three independent Q, K, V blocks (``d_out`` per block).
    Stacked (``nn.scan``) layers and conv kernels are handled by the geometry
    (each slice independent; conv fan-in = window x channels).

    Defaults and why: ``p = 2`` (the published default; ``p = 1`` is sign
    descent / d_in, larger ``p`` puts more weight on large entries);
    ``base_factor = 25`` (published range 20-30 at LR ~1e-2 for GPT-2;
    ``~sqrt(768)``, which makes p = 2 hidden updates the same entry size as
    the head's at GPT-2-small width); ``momentum = 0.95`` EMA, no Nesterov
    (as published; ``nesterov=True`` gives Muon-style lookahead);
    ``weight_decay = 0`` (as ``optax.contrib.muon``; when set, decoupled and
    applied to matrices and embeddings, not to vectors, also when stacked); ``q = p/(p-1)`` for the column
    variant, so it raises ``|h|`` to the same power ``p - 1`` as the row
    variant and ``p = 1`` gives ``q = inf`` (both ``sign(G) / d_in``).

    Args:
      learning_rate: float or optax schedule.
      p: row-variant input norm exponent, ``1 <= p < inf`` (also the head's).
      variant: ``'row'`` or ``'col'``: the rule for hidden matrices.
      q: column-variant output norm exponent, ``1 < q <= inf``; default
        ``p/(p-1)`` (``inf`` for ``p = 1``).
      base_factor: multiplier of the hidden ``'row'`` / ``'col'`` directions: the whole balance between the
        hidden rows and every other route at one learning rate (the other routes scaled by ``b`` are
        ``base_factor / b`` at learning rate ``x b``); a width-independent constant to tune at the proxy.
      head_base_width: ``None`` (default): the published head rule; a fan-in
        ``W > 0``: the width-consistent head above, equal to the published one
        when the head's fan-in is ``W`` (the proxy's width).
      momentum: EMA coefficient ``beta``.
      nesterov: use ``beta * mu + (1 - beta) * g`` as the normalized input.
      weight_decay: decoupled weight decay coefficient (multiplied by the LR).
      weight_decay_mask: optax mask (tree or callable); ``None`` (default):
        matrices and embeddings (the published ">= 2-D" rule, decided by
        geometry kind so that ``nn.scan``-stacked biases and norm scales,
        which are 2-D, are spared too).
      rules: ``{regex: rule}`` per-path overrides (first match wins), rule one
        of ``MOGA_RULES`` or an ``optax.GradientTransformation`` producing the
        direction for those leaves (it gets the raw gradients; weight decay
        and the LR are still applied), e.g. a per-path exponent and factor:
        ``optax.chain(optax.ema(0.95, debias=False),
        spectral_optax.scale_by_row_norm(1.5), optax.scale(40.0))``.
      embedding: rule of every embedding table, by geometry (``None``:
        ``'sign'``), as :func:`~spectral_optax.muon`'s keyword of the same
        name: one of ``MOGA_RULES``, ``'adamw'`` (``'adam'``, muon's
        spelling) or a transformation; ``rules=`` wins where it matches.
      vector: rule of biases and norm scales (``None``: ``'sign'``).
      output: rule of the read-out matrix (``None``: ``'head'``).
      geometry: see :func:`spectral_optax.as_geometry_map`.
      adam_b2, adam_eps: for leaves under the ``'adam'`` rule.
      mu_dtype: momentum dtype (default: the gradient's dtype).
      axis_name: inside ``shard_map`` / ``pmap``: how the parameters are
        sharded (a mesh axis name, a ``PartitionSpec`` or their tree; see docs/sharding.md).

    Returns:
      An ``optax.GradientTransformation``; works with
      ``optax.inject_hyperparams`` (pass ``static_args=('p',)`` to keep the
      fast static-exponent path for half-integer ``p``; pass the geometry as
      a ``GeometryMap`` or dict, not a live ``nnx.Module``, which
      ``inject_hyperparams`` would take for a schedule because it is callable).

    References:
      Wong, Xu, Li, Lu (2026); docs/math.md section 3.
    """
    if variant not in ("row", "col"):
        raise ValueError(f"variant must be 'row' or 'col', got {variant!r}")
    by_kind = {"embedding": embedding, "vector": vector, "output": output}
    for name, rule in by_kind.items():
        if (
            rule is not None
            and not isinstance(rule, optax.GradientTransformation)
            and _rule_name(rule) not in MOGA_RULES
        ):
            raise ValueError(
                f"{name}={rule!r}: a rule must be one of {MOGA_RULES}, 'adamw' or an optax.GradientTransformation"
            )
    for key, rule in (rules or {}).items():
        try:
            re.compile(key)
        except re.error as e:
            raise ValueError(
                f"rules: {key!r} is not a valid regular expression ({e}); rules map a regex "
                "re.search-ed on the '/'-joined parameter path to a rule"
            ) from e
        if isinstance(rule, str) and _rule_name(rule) not in MOGA_RULES:
            raise ValueError(
                f"rules[{key!r}] = {rule!r}: a rule must be one of {MOGA_RULES} or an optax.GradientTransformation"
            )
        if not isinstance(rule, (str, optax.GradientTransformation)):
            raise ValueError(
                f"rules[{key!r}] must be one of {MOGA_RULES} or an optax.GradientTransformation, "
                f"got {type(rule).__name__}"
            )
    if q is None:
        check_p(p)  # before deriving q from it (scale_by_row_norm checks it too, at construction)
        pv = static_value(p)
        if pv is not None:
            q = math.inf if pv == 1.0 else pv / (pv - 1.0)
        else:  # traced p (inject_hyperparams)
            pa = jnp.asarray(p, jnp.float32)
            q = jnp.where(pa == 1.0, jnp.inf, pa / jnp.where(pa == 1.0, 1.0, pa - 1.0))
    gmap = as_geometry_map(geometry)
    if head_base_width is None:
        head_direction: tuple = (scale_by_row_norm(p, geometry=gmap, fan_scaling=False, axis_name=axis_name),)
    else:
        wv, pv = static_value(head_base_width), static_value(p)
        if wv is not None and not (math.isfinite(wv) and wv > 0):
            raise ValueError(
                f"head_base_width must be a positive fan-in (the proxy model's width), got {head_base_width!r}; "
                "pass None for the published head rule"
            )
        if wv is not None and pv is not None:
            factor = wv ** (1.0 / pv)
        else:  # traced by inject_hyperparams
            factor = jnp.power(jnp.asarray(head_base_width, jnp.float32), 1.0 / jnp.asarray(p, jnp.float32))
        head_direction = (scale_by_row_norm(p, geometry=gmap, axis_name=axis_name), optax.scale(factor))

    def momentum_then(*parts):
        return optax.chain(ema_momentum(momentum, nesterov=nesterov, mu_dtype=mu_dtype), *parts)

    # The table {rule -> direction}; p and q are validated once, by the transforms' constructors.
    table = {
        "row": momentum_then(scale_by_row_norm(p, geometry=gmap, axis_name=axis_name), optax.scale(base_factor)),
        "col": momentum_then(scale_by_column_norm(q, geometry=gmap, axis_name=axis_name), optax.scale(base_factor)),
        "head": momentum_then(*head_direction),
        "sign": momentum_then(scale_by_sign()),
        "adam": optax.scale_by_adam(
            b1=momentum,
            b2=adam_b2,
            eps=adam_eps,
            mu_dtype=None if mu_dtype is None else jnp.dtype(mu_dtype),
            nesterov=nesterov,
        ),
    }
    for key, rule in (rules or {}).items():
        if not isinstance(rule, str):
            table[f"custom:{key}"] = rule
    for name, rule in by_kind.items():
        if isinstance(rule, optax.GradientTransformation):
            table[f"custom:{name}"] = rule

    def check_rules(paths):
        for key in rules or {}:
            if not any(re.search(key, p) for p in paths):
                shown = "\n    ".join(paths[:12]) + ("\n    ..." if len(paths) > 12 else "")
                raise ValueError(
                    f"moga: rules[{key!r}] matches no parameter (the regex is re.search-ed on the "
                    f"'/'-joined paths, which are:\n    {shown})\nFix the regex or drop the rule."
                )

    return train_float_leaves(
        optax.chain(
            geometry_partition(table, _route_fn(variant, rules, by_kind), gmap, check_paths=check_rules),
            *decay_then_learning_rate(learning_rate, weight_decay, weight_decay_mask, gmap),
        ),
        gmap,
    )


def _fan_factor(geom: Geometry, p, q, dtype):
    """``d_out^(1/q) / d_in^(1/p)`` for matrices, 1 otherwise."""
    if geom.kind != "matrix":
        return None
    pv, qv = static_value(p), static_value(q)
    if pv is not None and qv is not None:
        return (1.0 if math.isinf(qv) else geom.d_out ** (1.0 / qv)) / geom.d_in ** (1.0 / pv)
    p = jnp.asarray(p, jnp.float32)
    q = jnp.asarray(q, jnp.float32)
    return (jnp.power(float(geom.d_out), 1.0 / q) / jnp.power(float(geom.d_in), 1.0 / p)).astype(dtype)


def _scale_by_fan_ratio(p, q, gmap) -> optax.GradientTransformationExtraArgs:
    def leaf(geom, u):
        f = _fan_factor(geom, p, q, jnp.float32)
        if f is None:
            return u
        return (u.astype(jnp.promote_types(u.dtype, jnp.float32)) * f).astype(u.dtype)

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        return map_with_geometry(leaf, gmap, updates), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


@optax_aliases(mask="weight_decay_mask")
def rescaled_adamw(
    learning_rate: optax.ScalarOrSchedule,
    p: float = 1.0,
    q: float = math.inf,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 1e-4,
    weight_decay_mask: Any = None,
    mu_dtype: Any = None,
    nesterov: bool = False,
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """AdamW with Adam's step multiplied by ``d_out^(1/q) / d_in^(1/p)`` per matrix.

    ``update = -learning_rate * (s * adam(g) + weight_decay * W)`` with
    ``s = d_out^(1/q) / d_in^(1/p)`` for ``'matrix'`` leaves (``d_in``,
    ``d_out`` of each slice / QKV block from the geometry; conv fan-in =
    window x channels) and ``s = 1`` for embeddings and vectors, whose
    input width is 1. The default ``p = 1, q = inf`` gives ``1/d_in``:
    muP's Adam rule for hidden and output matrices, and the factor that meets
    the spectral condition: an Adam step is close to ``sign(G)``, whose
    spectral norm is about ``sqrt(d_in d_out)`` for a dense sign pattern, so
    ``sqrt(d_out / d_in) / sqrt(d_in d_out) = 1 / d_in``. Other ``(p, q)``
    give other factors; ``p = q = 2`` gives ``sqrt(d_out / d_in)``, which
    does *not* meet the spectral condition for a sign-like step (it is
    ``sqrt(d_in d_out)`` times too large).

    Args:
      learning_rate: float or optax schedule.
      p: fan-in exponent, ``1 <= p < inf``: the step is divided by
        ``d_in^(1/p)``.
      q: fan-out exponent, ``0 < q <= inf``: the step is multiplied by
        ``d_out^(1/q)`` (``inf``: by 1).
      b1: Adam's first-moment EMA decay rate.
      b2: Adam's second-moment EMA decay rate.
      eps: Adam's epsilon, added to the square root of the second moment.
      eps_root: Adam's epsilon inside the square root (as
        ``optax.scale_by_adam``).
      weight_decay: decoupled weight decay coefficient (multiplied by the LR,
        not by ``s``).
      weight_decay_mask: optax mask (tree or callable); ``None`` (default):
        matrices and embeddings, sparing vectors, as
        :func:`spectral_optax.mup_adamw`.
      mu_dtype: first-moment dtype (default: the gradient's dtype).
      nesterov: ``optax.scale_by_adam``'s Nesterov form of the first moment.
      geometry: see :func:`spectral_optax.as_geometry_map`.

    Returns:
      An ``optax.GradientTransformation``.

    References:
      Yang et al. (2022), "Tensor Programs V"; Wong, Xu, Li, Lu (2026);
      docs/math.md section 3.
    """
    check_p(p)
    qv = static_value(q)
    if qv is not None and not qv > 0:
        raise ValueError(f"q must be in (0, inf], got {q!r}")
    gmap = as_geometry_map(geometry)
    mu_dtype = None if mu_dtype is None else jnp.dtype(mu_dtype)
    return train_float_leaves(
        optax.chain(
            optax.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nesterov=nesterov),
            _scale_by_fan_ratio(p, q, gmap),
            *decay_then_learning_rate(learning_rate, weight_decay, weight_decay_mask, gmap),
        ),
        gmap,
    )
