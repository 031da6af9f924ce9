"""``muon``: momentum, orthogonalized per matrix, routed by geometry.

For every hidden matrix (per batch slice of its canonical view)::

    m_t = momentum m_{t-1} + (1 - momentum) g_t               (EMA momentum)
    n_t = momentum m_t + (1 - momentum) g_t  (Nesterov)  or  m_t
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
* leaves no geometry rule decides (kind ``'elementwise'``, e.g. a 3-D leaf
  of a plain pytree; a warning names them): AdamW, as ``optax.contrib.muon``
  does for every non-2-D leaf;
* any of them can be given an ``optax.GradientTransformation`` of your own
  (used as is: it must include its learning rate).

References:
  Jordan et al. (2024), Muon; Liu et al. (2025), "Muon is Scalable for LLM
  Training"; Large et al. (2024), modular norm (Embed); Pethick et al. (2025),
  Scion. The math: docs/math.md (spectral norm, Newton-Schulz).
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from spectral_optax._duals.polar import Coefficients
from spectral_optax._geometry import (
    KINDS,
    Geometry,
    GeometryLike,
    as_geometry_map,
)
from spectral_optax._optimizers.common import geometry_partition, optax_aliases, train_float_leaves
from spectral_optax._transforms.momentum import ema_momentum
from spectral_optax._transforms.orthogonalize import orthogonalize_via_newton_schulz
from spectral_optax._transforms.parametrization import route_of as leaf_route
from spectral_optax._transforms.spectral import scale_by_fan_out_rms
from spectral_optax._transforms.weight_decay import (
    decay_then_learning_rate,
)

__all__ = ["MUON_ROUTES", "muon"]

#: Built-in routes of :func:`~spectral_optax.muon` (values of ``embedding=``, ``vector=``, ``output=``).
MUON_ROUTES = ("muon", "adamw", "normalize")


def _check_route(name, value):
    if isinstance(value, optax.GradientTransformation) or value in MUON_ROUTES:
        return
    raise ValueError(f"{name}= must be one of {MUON_ROUTES} or an optax.GradientTransformation, got {value!r}")


def _decay_mask_fn(weight_decay_mask):
    """``params -> tree of bools`` from a tree, a bool or a callable (None: by geometry, see muon)."""
    if callable(weight_decay_mask):
        return weight_decay_mask
    if isinstance(weight_decay_mask, bool):
        return lambda params: jax.tree.map(lambda _: weight_decay_mask, params)
    return lambda params: jax.tree.map(lambda _, m: bool(m), params, weight_decay_mask)


@optax_aliases(
    beta="momentum",
    ns_coeffs="ns_coefficients",
    preconditioning="ns_preconditioning",
    eps="adam_eps",
    mask="weight_decay_mask",
)
def muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: float = 0.95,
    nesterov: bool = True,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    geometry: GeometryLike = None,
    scale: Any = "spectral",
    ns_coefficients: Coefficients = "auto",
    ns_steps: int | None = None,
    ns_method: str = "auto",
    compute_dtype: Any = None,
    ns_preconditioning: str | None = None,
    after_orthogonalize: optax.GradientTransformation | None = None,
    embedding: str | optax.GradientTransformation = "adamw",
    vector: str | optax.GradientTransformation = "adamw",
    output: str | optax.GradientTransformation = "muon",
    elementwise: str | optax.GradientTransformation = "adamw",
    bias_correction: bool = False,
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps: float = 1e-8,
    adam_eps_root: float = 0.0,
    adam_weight_decay: float = 0.0,
    adam_nesterov: bool = False,
    mu_dtype: Any = None,
    distribute: bool | None = None,
    flops_per_byte: float | None = None,
    axis_name: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """Muon with geometry-aware routing.

    Hidden matrices (``kind='matrix'``, ``role='hidden'``)::

        W <- W - lr * (scale(g) * NS(nesterov_ema(grad)) + weight_decay * W)

    per batch slice of the canonical view (conv kernels as ``(window x in,
    out)``, stacked layers as slices), ``NS`` the Newton-Schulz approximation
    of ``U V^T``. Other leaves are routed by kind (``embedding=``,
    ``vector=``) and role (``output=``) to ``'adamw'``, ``'normalize'`` (EMA
    momentum, each fan-out vector to RMS 1, decoupled weight decay, lr),
    ``'muon'``, or a transformation of your own (used as is: it must include
    its learning rate). Leaves no geometry rule decides get kind
    ``'elementwise'`` (with a :class:`~spectral_optax.GeometryWarning`) and
    the ``elementwise=`` route (AdamW by default); pass
    ``geometry=GeometryMap(strict=True)`` to raise instead.

    ``scale='spectral'`` (the default) differs from ``optax.contrib.muon``'s
    ``sqrt(max(1, d_out / d_in))`` on layers with ``d_out < d_in``; for the
    exact ``optax.contrib.muon`` update use :func:`~spectral_optax.contrib_muon`.

    The read-out takes the Muon route (``output='muon'``) by default: it
    transfers better across width than the AdamW head most Muon recipes use,
    which reaches a lower loss at its own tuned LR (docs/benchmarks.md,
    "Muon's head route").

    ``momentum = 0.95`` with Nesterov, as in Keller Jordan's Muon and
    ``optax.contrib.muon``; :func:`~spectral_optax.normuon` and
    :func:`~spectral_optax.moga` keep their own papers' plain EMA.

    The optimizer is one table ``{route: transform}`` (the routes above,
    each with and without decay) partitioned by geometry; the table does not
    depend on the model, so ``optax.tree_map_params`` works on the state.

    Args:
      learning_rate: learning rate or schedule of the Muon and normalize routes.
      momentum: EMA momentum coefficient.
      nesterov: use the Nesterov form ``momentum m_t + (1 - momentum) g_t``.
      weight_decay: decoupled weight decay of the Muon / normalize routes
        (multiplied by the learning rate, as in ``optax.adamw``).
      weight_decay_mask: ``None`` (decay matrices and embeddings, not
        vectors), a bool, a tree of bools like the params, or a function
        ``params -> tree of bools``. Applies to every route (with
        ``adam_weight_decay`` on the AdamW route).
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.
      scale: ``'spectral'`` (``sqrt(d_out / d_in)``), ``'muon'``
        (``sqrt(max(1, d_out / d_in))``), ``'rms'`` (``0.2 sqrt(max(d_in,
        d_out))``), a number or a function ``geometry -> number``.
      ns_coefficients: ``'auto'`` (default: ``'quintic'``, 5 steps, for
        float32 compute; ``'power4'``, 4 steps, for bfloat16, ``'polar_express_schatten'``,
        4 steps, for float16, :func:`spectral_optax.expert.auto_schedule`), ``'quintic'``, ``'polar_express'``,
        ``'power3'``, ``'power4'``, ``'you'``, an ``(a, b,
        c)`` triple, a table, or a function replacing the iteration.
      ns_steps: number of Newton-Schulz steps (default from the coefficients).
      ns_method: ``'auto'``, ``'standard'`` or ``'gram'``.
      compute_dtype: Newton-Schulz dtype; ``None``: float32 on CPU, bfloat16 on
        GPU/TPU.
      ns_preconditioning: ``None`` (the coefficients' own), ``'frobenius'``,
        ``'schatten'``, ``'aol'`` or ``'power'`` (see :func:`spectral_optax.newton_schulz`).
      after_orthogonalize: a transformation applied to the orthogonalized
        update of every Muon-routed leaf, before weight decay and the learning
        rate (:func:`spectral_optax.normuon` passes its neuron-wise
        normalization here).
      embedding: route of embedding tables.
      vector: route of biases and norm scales.
      output: route of the output head's matrix.
      elementwise: route of leaves no geometry rule decides (kind
        ``'elementwise'``).
      bias_correction: debias the momentum as ``optax.contrib.muon`` does
        (changes the Nesterov mix of momentum and gradient in early steps;
        see :func:`spectral_optax.ema_momentum`).
      adam_learning_rate: AdamW route's learning rate (default: ``learning_rate``).
      adam_b1, adam_b2, adam_eps, adam_eps_root: AdamW moments and epsilons.
      adam_weight_decay: AdamW route's decoupled weight decay.
      adam_nesterov: Nesterov form of the AdamW route (``optax.adamw``'s).
      mu_dtype: dtype of the momentum buffers (default: the param's dtype).
      distribute: spread whole matrices over the mesh's devices for the
        orthogonalization (default: when the updates are on a mesh); see
        :func:`spectral_optax.orthogonalize_via_newton_schulz` and docs/sharding.md.
      flops_per_byte: the distributed plan's flops per collective byte (default: the device's row of
        the table in :func:`~spectral_optax.orthogonalize_via_newton_schulz`).
      axis_name: inside ``shard_map`` / ``pmap``: how the parameters are
        sharded (a mesh axis name, a ``PartitionSpec`` or their tree).

    Returns:
      An ``optax.GradientTransformationExtraArgs``. Works under
      ``optax.inject_hyperparams`` (pass callables such as
      ``weight_decay_mask`` in ``static_args``); its state is a tree of arrays.

    References:
      Jordan et al. (2024), Muon; Liu et al. (2025), Moonlight; Amsel et al.
      (2025), Polar Express. The math: docs/math.md.
    """
    routes = {"embedding": embedding, "vector": vector, "output": output, "elementwise": elementwise}
    for name, value in routes.items():
        _check_route(name, value)
    gmap = as_geometry_map(geometry)
    adam_lr = learning_rate if adam_learning_rate is None else adam_learning_rate

    def momentum_then(direction):
        return [
            ema_momentum(momentum, nesterov=nesterov, mu_dtype=mu_dtype, bias_correction=bias_correction),
            direction,
        ]

    # Built once here: validates the Newton-Schulz options at construction.
    orthogonalize = orthogonalize_via_newton_schulz(
        geometry=gmap,
        kinds=KINDS,  # the routing decides which leaves take the Muon route
        scale=scale,
        ns_coefficients=ns_coefficients,
        ns_steps=ns_steps,
        ns_method=ns_method,
        compute_dtype=compute_dtype,
        distribute=distribute,
        flops_per_byte=flops_per_byte,
        axis_name=axis_name,
        ns_preconditioning=ns_preconditioning,
    )
    heads = {
        "muon": momentum_then(orthogonalize) + ([after_orthogonalize] if after_orthogonalize is not None else []),
        "normalize": momentum_then(scale_by_fan_out_rms(geometry=gmap, axis_name=axis_name)),
    }
    table: dict[str, optax.GradientTransformation] = {}
    for name, parts in heads.items():
        table[name] = optax.chain(*parts, *decay_then_learning_rate(learning_rate, weight_decay, True))
        table[name + ":nodecay"] = optax.chain(*parts, *decay_then_learning_rate(learning_rate, 0.0))
    for name, wd in (("adamw", adam_weight_decay), ("adamw:nodecay", 0.0)):
        table[name] = optax.adamw(
            adam_lr,
            b1=adam_b1,
            b2=adam_b2,
            eps=adam_eps,
            eps_root=adam_eps_root,
            weight_decay=wd,
            mu_dtype=mu_dtype,
            nesterov=adam_nesterov,
        )
    for key, value in routes.items():
        if isinstance(value, optax.GradientTransformation):
            table[f"custom:{key}"] = value
            table[f"custom:{key}:nodecay"] = value

    def route_of(_path: str, g: Geometry) -> str:
        key = leaf_route(g)  # 'hidden' matrices take the Muon route itself
        value = "muon" if key == "hidden" else routes[key]
        return f"custom:{key}" if isinstance(value, optax.GradientTransformation) else value

    # Routes split by the decay mask whatever the decay's value, so that a literal 0 and an injected (traced)
    # one give the same labels and the same state structure.
    split = (
        _decay_mask_fn(weight_decay_mask)
        if weight_decay_mask is not None
        else (
            lambda params: jax.tree.map(
                lambda g: g.kind != "vector", gmap.tree(params), is_leaf=lambda x: isinstance(x, Geometry)
            )
        )
    )
    return train_float_leaves(geometry_partition(table, route_of, gmap, split=split), gmap)
