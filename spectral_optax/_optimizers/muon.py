"""``muon``: momentum, orthogonalized per matrix, routed by geometry.

For every hidden matrix (per batch slice of its canonical view)::

    m_t = beta m_{t-1} + (1 - beta) g_t                       (EMA momentum)
    n_t = beta m_t + (1 - beta) g_t  (Nesterov)  or  m_t
    W  <- W - lr * (scale * NS(n_t) + weight_decay * W)      (NS(G) ~ U V^T)

with ``scale = sqrt(d_out / d_in)`` by default (the spectral condition; see
:func:`spectral_optax.orthogonalize_via_newton_schulz` for ``'muon'`` and
``'rms'``). Other parameters are routed by their geometry kind:

* embeddings and vectors (biases, norm scales): AdamW by default, or
  ``'normalize'`` (their own dual: momentum then every token's fan-out
  vector scaled to RMS 1, the l1 -> RMS steepest-descent direction, and
  weight decay), or ``'muon'``;
* the output head (a matrix with role ``'output'``): ``'muon'`` by default
  (the spectral condition holds for the read-out layer too), or ``'adamw'``
  / ``'normalize'``;
* any of them can be given an ``optax.GradientTransformation`` of your own
  (used as is: it must include its learning rate).

References:
  Jordan et al. (2024), Muon; Liu et al. (2025), "Muon is Scalable for LLM
  Training"; Large et al. (2024), modular norm (Embed); Pethick et al. (2025),
  Scion. REFERENCE.md sections 3-4.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from spectral_optax._duals.embedding import normalize_fan_out_rms
from spectral_optax._geometry import (
    Geometry,
    GeometryLike,
    GeometryMap,
    as_geometry_map,
)
from spectral_optax._duals.polar import Coefficients
from spectral_optax._transforms.dual import dual_map_transform
from spectral_optax._transforms.orthogonalize import orthogonalize_via_newton_schulz

ROUTES = ("muon", "adamw", "normalize")


class EmaMomentumState(NamedTuple):
    """``mu``: the EMA of the gradients (same tree as the params)."""

    mu: Any


def _ema_momentum(beta, nesterov: bool, mu_dtype) -> optax.GradientTransformation:
    """``m <- beta m + (1 - beta) g``; returns ``beta m + (1 - beta) g`` (Nesterov) or ``m``.

    No bias correction: every route after it is invariant to the update's scale.
    """

    def init_fn(params):
        return EmaMomentumState(
            jax.tree.map(lambda p: jnp.zeros(p.shape, mu_dtype or p.dtype), params)
        )

    def update_fn(updates, state, params=None):
        del params

        def ema(m, g):  # in float32 (or wider) whatever the storage dtype
            dtype = jnp.promote_types(g.dtype, jnp.float32)
            return beta * m.astype(dtype) + (1 - beta) * g.astype(dtype)

        mu32 = jax.tree.map(ema, state.mu, updates)
        if nesterov:
            out = jax.tree.map(lambda m, g: ema(m, g).astype(g.dtype), mu32, updates)
        else:
            out = jax.tree.map(lambda m, g: m.astype(g.dtype), mu32, updates)
        mu = jax.tree.map(lambda m, old: m.astype(old.dtype), mu32, state.mu)
        return out, EmaMomentumState(mu)

    return optax.GradientTransformation(init_fn, update_fn)


def _normalize_fan_out(geometry: GeometryLike) -> optax.GradientTransformation:
    """Every fan-in index's fan-out vector scaled to RMS 1 (l1 -> RMS dual)."""
    return dual_map_transform(normalize_fan_out_rms, geometry)


def _check_route(name, value):
    if isinstance(value, optax.GradientTransformation):
        return
    if value not in ROUTES:
        raise ValueError(
            f"{name}= must be one of {ROUTES} or an optax.GradientTransformation, got {value!r}"
        )


def muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    beta: float = 0.95,
    nesterov: bool = True,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    geometry: GeometryLike = None,
    scale: Any = "spectral",
    ns_coefficients: Coefficients = "quintic",
    ns_steps: int | None = None,
    ns_method: str = "auto",
    compute_dtype: Any = None,
    embedding: str | optax.GradientTransformation = "adamw",
    vector: str | optax.GradientTransformation = "adamw",
    output: str | optax.GradientTransformation = "muon",
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps: float = 1e-8,
    adam_weight_decay: float = 0.0,
    mu_dtype: Any = None,
) -> optax.GradientTransformation:
    """Muon with geometry-aware routing.

    Hidden matrices (``kind='matrix'``, ``role='hidden'``)::

        W <- W - lr * (scale(g) * NS(nesterov_ema(grad)) + weight_decay * W)

    per batch slice of the canonical view (conv kernels as ``(window x in,
    out)``, stacked layers as slices), ``NS`` the Newton-Schulz approximation
    of ``U V^T``. Other leaves are routed by kind (``embedding=``,
    ``vector=``) and role (``output=``) to ``'adamw'``, ``'normalize'`` (EMA
    momentum, each fan-out vector to RMS 1, decoupled weight decay, lr),
    ``'muon'``, or a transformation of your own.

    Args:
      learning_rate: learning rate or schedule of the Muon and normalize routes.
      beta: EMA momentum coefficient.
      nesterov: use the Nesterov form ``beta m_t + (1 - beta) g_t``.
      weight_decay: decoupled weight decay of the Muon / normalize routes
        (multiplied by the learning rate, as in ``optax.adamw``).
      weight_decay_mask: ``None`` (decay matrices and embeddings, not
        vectors), a tree of bools like the params, or a function
        ``params -> tree of bools``. Applies to every route (with
        ``adam_weight_decay`` on the AdamW route).
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.
      scale: ``'spectral'`` (``sqrt(d_out / d_in)``), ``'muon'``
        (``sqrt(max(1, d_out / d_in))``), ``'rms'`` (``0.2 sqrt(max(d_in,
        d_out))``), a number or a function ``geometry -> number``.
      ns_coefficients: ``'quintic'`` (default, 5 steps), ``'polar_express'``,
        an ``(a, b, c)`` triple, a table, or a function replacing the iteration.
      ns_steps: number of Newton-Schulz steps (default from the coefficients).
      ns_method: ``'auto'``, ``'standard'`` or ``'gram'``.
      compute_dtype: Newton-Schulz dtype; ``None``: float32 on CPU, bfloat16 on
        GPU/TPU.
      embedding: route of embedding tables.
      vector: route of biases and norm scales.
      output: route of the output head's matrix.
      adam_learning_rate: AdamW route's learning rate (default: ``learning_rate``).
      adam_b1, adam_b2, adam_eps: AdamW moments and epsilon.
      adam_weight_decay: AdamW route's decoupled weight decay.
      mu_dtype: dtype of the momentum buffers (default: the param's dtype).

    Returns:
      An ``optax.GradientTransformation``. Works under
      ``optax.inject_hyperparams`` (pass callables such as
      ``weight_decay_mask`` in ``static_args``); its state is a tree of arrays.

    References:
      Jordan et al. (2024), Muon; Liu et al. (2025), Moonlight; Amsel et al.
      (2025), Polar Express. REFERENCE.md sections 3-4.
    """
    routes = {"embedding": embedding, "vector": vector, "output": output}
    for name, value in routes.items():
        _check_route(name, value)
    if ns_method not in ("auto", "standard", "gram"):
        raise ValueError(f"ns_method must be 'auto', 'standard' or 'gram', got {ns_method!r}")
    gmap = as_geometry_map(geometry)
    adam_lr = learning_rate if adam_learning_rate is None else adam_learning_rate

    def route_of(g: Geometry) -> tuple[str, Any]:
        if g.kind == "matrix":
            key = "output" if g.role == "output" else None
        else:
            key = g.kind
        value = "muon" if key is None else routes[key]
        if isinstance(value, optax.GradientTransformation):
            return f"custom:{key}", value
        return value, None

    def decay_mask(params, geoms):
        if weight_decay_mask is None:
            return jax.tree.map(lambda g: g.kind != "vector", geoms)
        mask = weight_decay_mask(params) if callable(weight_decay_mask) else weight_decay_mask
        if isinstance(mask, bool):
            return jax.tree.map(lambda _: mask, params)
        return jax.tree.map(lambda _, m: bool(m), params, mask)

    def build(tree):
        geoms = gmap.tree(tree)
        explicit = GeometryMap(tree=geoms)  # one resolution, shared by every route
        mask = decay_mask(tree, geoms)
        is_geom = lambda x: isinstance(x, Geometry)
        custom: dict[str, optax.GradientTransformation] = {}

        def label(g, decay):
            name, tx = route_of(g)
            if tx is not None:
                custom[name] = tx
                return name
            return name if decay else name + ":nodecay"

        labels = jax.tree.map(label, geoms, mask, is_leaf=is_geom)
        used = set(jax.tree.leaves(labels))
        transforms = {}
        for lab in used:
            if lab in custom:
                transforms[lab] = custom[lab]
                continue
            route, decay = lab.split(":")[0], not lab.endswith(":nodecay")
            if route == "adamw":
                transforms[lab] = optax.adamw(
                    adam_lr,
                    b1=adam_b1,
                    b2=adam_b2,
                    eps=adam_eps,
                    weight_decay=adam_weight_decay if decay else 0.0,
                    mu_dtype=mu_dtype,
                )
                continue
            if route == "muon":
                direction = orthogonalize_via_newton_schulz(
                    geometry=explicit,
                    scale=scale,
                    coefficients=ns_coefficients,
                    steps=ns_steps,
                    compute_dtype=compute_dtype,
                    method=ns_method,
                )
            else:
                direction = _normalize_fan_out(explicit)
            transforms[lab] = optax.chain(
                _ema_momentum(beta, nesterov, mu_dtype),
                direction,
                # A literal 0 skips the pass (an injected hyperparameter is an
                # array: then the structure must not depend on its value).
                optax.identity()
                if not decay or (isinstance(weight_decay, (int, float)) and weight_decay == 0)
                else optax.add_decayed_weights(weight_decay),
                optax.scale_by_learning_rate(learning_rate),
            )
        return optax.partition(transforms, labels)

    def init_fn(params):
        return build(params).init(params)

    def update_fn(updates, state, params=None):
        return build(updates).update(updates, state, params)

    return optax.GradientTransformation(init_fn, update_fn)
