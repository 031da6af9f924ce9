"""Alignment at initialization (the spectral-condition paper's Claim 1) and the gradients it is measured on."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from spectral_optax._geometry import (
    Geometry,
    to_matrix,
)
from spectral_optax._numerics import safe_norm, top_singular_value
from spectral_optax.diagnostics._measures import _as_geometry, _f32


# --------------------------------------------------------------------------
# Alignment at initialization (the paper's Claim 1).
# --------------------------------------------------------------------------
def init_alignment(
    w, x=None, *, geometry: Geometry | None = None, key=None, num_inputs: int = 16
) -> dict[str, jax.Array]:
    """How a weight at initialization meets the spectral condition, per matrix slice.

    For ``W`` of shape ``(d_in, d_out)`` with i.i.d. entries of standard
    deviation ``sigma``, random-matrix theory gives ``||W||_* ~ sigma
    (sqrt(d_in) + sqrt(d_out))``, and for an input ``x`` not aligned with
    ``W``, ``||x W|| ~ sigma sqrt(d_out) ||x||``. So the alignment of the
    init with an input,

        a(x) = ||x W||_2 / (||W||_* ||x||_2)  ~  sqrt(d_out) / (sqrt(d_in) + sqrt(d_out)),

    is Theta(1) when the dimensions are proportional and at least about 1/2
    when ``d_out >= d_in``: the spectral norm, not a smaller "typical"
    stretch, is what acts on the features at initialization.

    Args:
      w: the weight (any layout; read through its geometry).
      x: inputs ``(batch, d_in)`` in the canonical fan-in order; default
        ``num_inputs`` standard Gaussian vectors drawn with ``key``.
      geometry: the weight's :class:`~spectral_optax.Geometry` (default: a
        matrix with fan-in axis -2 and fan-out axis -1).
      key: PRNG key for the default inputs (default ``jax.random.key(0)``).
      num_inputs: number of default inputs.

    Returns:
      a dict of arrays of shape ``(num_slices,)``: ``sigma`` (RMS of the
      entries), ``spectral_norm`` (exact, SVD), ``predicted_spectral_norm``
      (``sigma (sqrt(d_in) + sqrt(d_out))``), ``alignment`` (mean of
      ``a(x)`` over the inputs) and ``predicted_alignment`` (above).

    References:
      Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature
      Learning", Claim 1 and section 3.
    """
    g = _as_geometry(w, geometry)
    if g.kind != "matrix":
        raise ValueError(f"init_alignment needs a matrix weight, got a {g.kind!r} of shape {g.shape}")
    m = to_matrix(_f32(w), g)  # (slices, d_in, d_out)
    d_in, d_out = g.d_in, g.d_out
    if x is None:
        k = jax.random.key(0) if key is None else key
        x = jax.random.normal(k, (num_inputs, d_in), m.dtype)
    x = _f32(x)
    if x.ndim != 2 or x.shape[-1] != d_in:
        raise ValueError(f"init_alignment: x must have shape (batch, d_in={d_in}), got {x.shape}")
    sigma = jnp.sqrt(jnp.mean(m**2, axis=(-2, -1)))
    top = top_singular_value(m, "svd")
    xw = safe_norm(jnp.einsum("bi,sio->sbo", x, m), axis=-1)  # (slices, batch)
    a = xw / jnp.maximum(top[:, None] * safe_norm(x, axis=-1)[None, :], 1e-30)
    root = math.sqrt(d_in) + math.sqrt(d_out)
    return {
        "sigma": sigma,
        "spectral_norm": top,
        "predicted_spectral_norm": sigma * root,
        "alignment": jnp.mean(a, axis=-1),
        "predicted_alignment": jnp.full_like(sigma, math.sqrt(d_out) / root),
    }


# --------------------------------------------------------------------------
# Stable rank of gradients (the paper's figure): batch gradients are low rank.
# --------------------------------------------------------------------------
_ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh, "linear": lambda z: z}


def mlp_batch_gradient(
    x,
    y=None,
    *,
    width: int,
    key,
    activation: str | Callable = "relu",
    layer: int = 1,
    depth: int = 2,
    num_outputs: int = 1,
    loss: str = "neg_f",
    gain: float | None = None,
    example_weights=None,
) -> jax.Array:
    """The batch gradient ``dL/dW_layer`` of a random bias-free MLP.

    MLP ``d_in -> width^depth -> num_outputs`` with Gaussian init of std
    ``gain / sqrt(fan_in)`` (``gain`` defaults to ``sqrt(2)`` for ReLU and 1
    otherwise), loss averaged over the batch:

    * ``'neg_f'``: ``-sum(f)`` (every example pushes the output up);
    * ``'mse'``: ``0.5 ||f - y||^2`` (``y``: ``(batch,)`` or ``(batch, num_outputs)``);
    * ``'xent'``: softmax cross-entropy with integer labels ``y``.

    The gradient of a hidden weight is a sum of ``B`` outer products
    ``h_{l-1,b} delta_{l,b}^T``, one per example; its stable rank
    ``||dW||_F^2 / ||dW||_*^2`` says how many of them point in different
    directions (the paper's argument that ``||dW||_F ~ ||dW||_*``).

    Args:
      x: inputs ``(batch, d_in)``.
      y: targets (see ``loss``); ignored for ``'neg_f'``.
      width: hidden width.
      key: PRNG key of the initialization.
      activation: ``'relu'``, ``'tanh'``, ``'linear'`` or a callable.
      layer: which weight (0 = input layer, ``depth`` = read-out); default
        1, the first hidden-to-hidden matrix.
      depth: number of hidden layers.
      num_outputs: output width.
      loss: ``'neg_f'``, ``'mse'`` or ``'xent'``.
      gain: init gain (see above).
      example_weights: optional ``(batch,)`` non-negative weights ``w_b``; the
        loss becomes ``sum_b w_b l_b / sum_b w_b``. A 0/1 mask selects a
        sub-batch with fixed shapes, so one compiled program serves every
        batch size (e.g. under ``jax.vmap`` over masks).

    Returns:
      the gradient, shape ``(fan_in, fan_out)`` of that layer.
    """
    act = _ACTIVATIONS.get(activation, activation) if isinstance(activation, str) else activation
    if not callable(act):
        raise TypeError(f"activation must be one of {sorted(_ACTIVATIONS)} or a callable, got {activation!r}")
    if not 0 <= layer <= depth:
        raise ValueError(f"layer must be in [0, depth={depth}], got {layer}")
    if loss not in ("neg_f", "mse", "xent"):
        raise ValueError(f"loss must be 'neg_f', 'mse' or 'xent', got {loss!r}")
    if loss != "neg_f" and y is None:
        raise ValueError(f"loss={loss!r} needs targets y")
    if gain is None:
        gain = math.sqrt(2.0) if activation == "relu" else 1.0
    x = _f32(x)
    dims = [x.shape[-1]] + [width] * depth + [num_outputs]
    keys = jax.random.split(key, depth + 1)
    ws = [gain / math.sqrt(a) * jax.random.normal(k, (a, b), x.dtype) for k, a, b in zip(keys, dims[:-1], dims[1:])]

    def loss_fn(ws):
        h = x
        for w in ws[:-1]:
            h = act(h @ w)
        f = h @ ws[-1]
        if loss == "neg_f":
            per_example = -jnp.sum(f, axis=-1)
        elif loss == "xent":
            per_example = optax.softmax_cross_entropy_with_integer_labels(f, jnp.asarray(y, jnp.int32))
        else:
            per_example = 0.5 * jnp.sum((f - jnp.asarray(y, f.dtype).reshape(f.shape)) ** 2, axis=-1)
        if example_weights is None:
            return jnp.mean(per_example)
        wts = jnp.asarray(example_weights, f.dtype)
        return jnp.sum(wts * per_example) / jnp.maximum(jnp.sum(wts), 1e-30)

    return jax.grad(loss_fn)(ws)[layer]


def outer_product_sum(key, d_in: int, d_out: int, batch: int, *, example_weights=None) -> jax.Array:
    """``sum_b w_b u_b v_b^T`` of ``batch`` independent standard Gaussian outer products.

    The no-structure baseline of the stable-rank figure: its stable rank
    grows with ``batch`` toward that of a square Gaussian matrix,
    ``d^2 / (2 sqrt(d))^2 = d / 4`` for ``d_in = d_out = d``.

    Args:
      key: PRNG key of the vectors ``u_b``, ``v_b``.
      d_in: length of each ``u_b`` (rows of the result).
      d_out: length of each ``v_b`` (columns of the result).
      batch: number of outer products ``B``.
      example_weights: optional ``(batch,)`` weights ``w_b`` (default all 1);
        a 0/1 mask selects a sub-batch with fixed shapes (see
        :func:`~spectral_optax.diagnostics.mlp_batch_gradient`).

    Returns:
      the ``(d_in, d_out)`` float32 sum.
    """
    ku, kv = jax.random.split(key)
    u = jax.random.normal(ku, (batch, d_in))
    v = jax.random.normal(kv, (batch, d_out))
    if example_weights is not None:
        u = u * jnp.asarray(example_weights, u.dtype)[:, None]
    return u.T @ v
