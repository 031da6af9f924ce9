"""Diagnostics of feature learning: is every layer moving by Theta(1)?

The spectral condition asks that hidden features ``h`` and their updates
``dh`` have comparable size at every width, and that every weight and weight
update has spectral norm ``Theta(sqrt(d_out / d_in))``. These functions
measure exactly that:

* :func:`relative_change`: ``||x_new - x_old||_F / ||x_old||_F`` (features:
  the relative feature change ``||dh|| / ||h||``).
* :func:`relative_weight_change`: ``||dW||_* / ||W||_*`` (spectral) or
  ``||dW||_F / ||W||_F`` per parameter, on the canonical matrix view of the
  parameter's :class:`~spectral_optax.Geometry` (max over slices).
* :func:`spectral_norm`, :func:`stable_rank` (``||W||_F^2 / ||W||_*^2``).
* :func:`alignment`: final-layer alignment ``|f| / (||w_out|| ||h||)``.
* :func:`coord_check`: trains a bias-free ReLU MLP for a few steps at several
  widths with a given optimizer and tabulates the relative change of every
  layer's activations (a width-independent table is what muP promises).

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning"
  (relative changes, alignment, Figures 1-3). Yang et al. (2021), "Tensor
  Programs V" (coordinate checks). docs/math.md section 2.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spectral_optax._callables import required_positional
from spectral_optax._geometry import (
    Geometry,
    GeometryLike,
    map_with_geometry,
    to_matrix,
)
from spectral_optax._numerics import safe_max_abs, safe_norm, top_singular_value
from spectral_optax.initializers import spectral_normal

__all__ = [
    "relative_change",
    "relative_feature_change",
    "spectral_norm",
    "frobenius_norm",
    "stable_rank",
    "relative_weight_change",
    "alignment",
    "CoordCheck",
    "coord_check",
    "coord_check_mlp",
]


def _f32(x):
    x = jnp.asarray(x)
    return x.astype(jnp.float32) if x.dtype != jnp.float64 else x


def relative_change(new, old, eps: float = 1e-30) -> jax.Array:
    """``||new - old||_F / ||old||_F`` (0 when both are 0, inf when only old is).

    Computed in float32 (float64 inputs stay float64), without overflow.

    Args:
      new: the changed array (any shape; the norms run over all entries).
      old: the reference array, of the same shape.
      eps: a norm at or below ``eps`` counts as 0: ``||old||_F <= eps`` gives
        0 when also ``||new - old||_F <= eps`` and inf otherwise.

    Returns:
      a scalar.
    """
    new, old = _f32(new), _f32(old)
    num = safe_norm(new - old)
    den = safe_norm(old)
    return jnp.where(den > eps, num / jnp.maximum(den, eps), jnp.where(num > eps, jnp.inf, 0.0))


def relative_feature_change(features_new, features_old) -> Any:
    """``||dh|| / ||h||`` per feature: :func:`relative_change` on each leaf.

    Args:
      features_new: the activations after training, a tree (e.g. a dict by
        layer name of ``(batch, width)`` arrays); each leaf's Frobenius norm
        runs over the whole batch.
      features_old: the activations before training on the same inputs, a
        tree of the same structure.

    Returns:
      a tree of scalars with the structure of ``features_new``.
    """
    return jax.tree.map(relative_change, features_new, features_old)


def _as_geometry(x, geometry: Geometry | None) -> Geometry:
    if geometry is not None:
        return geometry
    shape = tuple(np.shape(x))
    if len(shape) < 2:
        return Geometry.vector(shape)
    return Geometry.matrix(shape)


def spectral_norm(x, geometry: Geometry | None = None, *, method: str = "auto", iters: int = 100) -> jax.Array:
    """``||W||_*`` (largest singular value) of the canonical matrix view.

    Several slices (stacked layers, heads): the maximum over slices.

    Args:
      x: the parameter (or update).
      geometry: its :class:`~spectral_optax.Geometry`; default: a matrix with
        fan-in axis -2 and fan-out axis -1 (a vector for < 2 dims).
      method: ``'svd'`` (exact), ``'power'`` (``iters`` power iterations, for
        large matrices) or ``'auto'`` (SVD up to min dimension 1024).
      iters: number of power iterations (cold-started, on the shorter side);
        used only when the power method runs.
    """
    m = to_matrix(_f32(x), _as_geometry(x, geometry))
    return jnp.max(top_singular_value(m, method, iters))


def frobenius_norm(x) -> jax.Array:
    """``||W||_F``, the square root of the sum of squared entries (no overflow).

    Args:
      x: an array of any shape; computed in float32 (float64 stays float64).
    """
    return safe_norm(_f32(x))


def stable_rank(x, geometry: Geometry | None = None, *, method: str = "auto") -> jax.Array:
    """``||W||_F^2 / ||W||_*^2`` of the matrix view (per slice; the mean over slices).

    Between 1 (rank one) and ``min(d_in, d_out)`` (all singular values
    equal); scale-invariant.

    Args:
      x: the parameter (or update).
      geometry: its :class:`~spectral_optax.Geometry`; default: a matrix with
        fan-in axis -2 and fan-out axis -1 (a vector for < 2 dims).
      method: how ``||W||_*`` is computed, as in :func:`spectral_norm`
        (100 power iterations for ``'power'``).
    """
    m = to_matrix(_f32(x), _as_geometry(x, geometry))
    m = m / safe_max_abs(m, axis=(-2, -1))  # scale-invariant; avoids overflow
    top = top_singular_value(m, method, 100)
    fro2 = jnp.sum(m**2, axis=(-2, -1))
    return jnp.mean(fro2 / jnp.maximum(top**2, 1e-30))


def relative_weight_change(
    new, old, *, norm: str = "spectral", geometry: GeometryLike = None, method: str = "auto"
) -> Any:
    """``||W_new - W_old|| / ||W_old||`` per parameter.

    Args:
      new, old: parameter trees (or single arrays) of equal structure.
      norm: ``'spectral'`` (largest singular value of the canonical matrix
        view, max over slices) or ``'frobenius'``.
      geometry: geometry overrides for trees (see
        :func:`spectral_optax.as_geometry_map`), or a
        :class:`~spectral_optax.Geometry` for a single array.
      method: spectral-norm method, see :func:`spectral_norm`.

    Returns:
      a tree of scalars with the structure of ``new`` (a scalar for arrays).
    """
    if norm not in ("spectral", "frobenius"):
        raise ValueError(f"norm must be 'spectral' or 'frobenius', got {norm!r}")

    def one(g, a, b):
        if norm == "frobenius":
            return relative_change(a, b)
        num = spectral_norm(_f32(a) - _f32(b), g, method=method)
        den = spectral_norm(b, g, method=method)
        return num / jnp.maximum(den, 1e-30)

    if hasattr(new, "shape") and hasattr(old, "shape"):
        g = geometry if isinstance(geometry, Geometry) else _as_geometry(new, None)
        return one(g, new, old)
    return map_with_geometry(one, geometry, new, old)


def alignment(f, w_out, h) -> jax.Array:
    """Final-layer alignment ``|f| / (||w_out|| ||h||)``, averaged over the batch.

    1 means the read-out vector points along the features (a low-rank,
    aligned update: what feature learning produces); ~``1/sqrt(n)`` means
    random alignment.

    Args:
      f: outputs ``(batch,)`` or ``(batch, 1)``.
      w_out: read-out weights ``(n,)`` or ``(n, 1)``.
      h: last hidden features ``(batch, n)``.
    """
    f = _f32(f).reshape(-1)
    h = _f32(h).reshape(f.shape[0], -1)
    wn = safe_norm(_f32(w_out))
    hn = safe_norm(h, axis=-1)
    return jnp.mean(jnp.abs(f) / jnp.maximum(wn * hn, 1e-30))


# --------------------------------------------------------------------------
# Coordinate check.
# --------------------------------------------------------------------------
def coord_check_mlp(
    width: int, *, depth: int = 2, d_in: int = 32, d_out: int = 1, init: str = "spectral", gain: float = math.sqrt(2.0)
):
    """The coordinate-check model: a bias-free ReLU MLP ``d_in -> width^depth -> d_out``.

    Returns ``(init_fn, features_fn)``: ``init_fn(key) -> params`` (a dict
    ``{'Dense_0': {'kernel'}, ..., 'head': {'kernel'}}`` in Flax layout) and
    ``features_fn(params, x) -> {'h1': ..., 'h<depth>': ..., 'out': ...}``
    (post-ReLU hidden activations and the output).

    ``init='spectral'``: Parametrization 1, std ``gain / sqrt(d_in) *
    min(1, sqrt(d_out / d_in))`` per layer; ``init='standard'``: Kaiming
    (SP), std ``gain / sqrt(d_in)`` for every layer (``d_in``, ``d_out``:
    that layer's fan-in and fan-out).

    Args:
      width: width of every hidden layer.
      depth: number of hidden layers (``depth + 1`` weight matrices).
      d_in: input dimension.
      d_out: output dimension.
      init: ``'spectral'`` or ``'standard'`` (above).
      gain: the init gain; the default ``sqrt(2)`` is the ReLU gain.
    """
    if init not in ("spectral", "standard"):
        raise ValueError(f"init must be 'spectral' or 'standard', got {init!r}")
    dims = [d_in] + [width] * depth + [d_out]
    names = [f"Dense_{i}" for i in range(depth)] + ["head"]

    # The package's own initializers: Parametrization 1 or Kaiming (SP).
    if init == "spectral":
        kernel_init = spectral_normal(gain=gain)
    else:
        kernel_init = jax.nn.initializers.variance_scaling(gain**2, "fan_in", "normal")

    def init_fn(key):
        keys = jax.random.split(key, len(names))
        return {
            name: {"kernel": kernel_init(k, (a, b), jnp.float32)}
            for k, name, a, b in zip(keys, names, dims[:-1], dims[1:])
        }

    def features_fn(params, x):
        feats = {}
        h = x
        for i in range(depth):
            h = jax.nn.relu(h @ params[f"Dense_{i}"]["kernel"])
            feats[f"h{i + 1}"] = h
        feats["out"] = h @ params["head"]["kernel"]
        return feats

    return init_fn, features_fn


@dataclasses.dataclass
class CoordCheck:
    """Result of :func:`coord_check`.

    Attributes:
      widths: the widths.
      table: ``{layer: [mean over seeds per width]}``: ``||dh|| / ||h||`` for
        hidden layers ``h1..``; for the output ``out`` the absolute RMS
        change ``rms(f_t - f_0)`` (``f_0`` itself shrinks with width under muP).
      std: same layout, standard deviation over seeds.
      steps: training steps taken.
    """

    widths: list[int]
    table: dict[str, list[float]]
    std: dict[str, list[float]]
    steps: int
    name: str = ""

    def ratio(self, layer: str) -> float:
        """``max / min`` over widths of a layer's relative change (inf if any
        entry is non-finite or 0)."""
        v = np.asarray(self.table[layer], float)
        if not np.all(np.isfinite(v)) or v.min() <= 0:
            return float("inf")
        return float(v.max() / v.min())

    def growth(self, layer: str) -> float:
        """Last width's value over the first width's."""
        v = np.asarray(self.table[layer], float)
        return float(v[-1] / v[0]) if v[0] > 0 else float("inf")

    def format(self) -> str:
        """A plain-text table (widths as columns)."""
        head = f"{self.name or 'coord check'} (relative change after {self.steps} steps)"
        lines = [head, "layer  " + " ".join(f"{w:>9d}" for w in self.widths)]
        for layer, vals in self.table.items():
            lines.append(f"{layer:6s} " + " ".join(f"{v:9.3g}" for v in vals))
        return "\n".join(lines)

    def plot(self, path=None, *, ax=None, title=None):
        """Relative change vs width (log-log), one line per layer."""
        import matplotlib

        matplotlib.use("Agg") if ax is None and path is not None else None
        import matplotlib.pyplot as plt

        fig = None
        if ax is None:
            fig, ax = plt.subplots(figsize=(3.6, 2.8))
        for layer, vals in self.table.items():
            ax.errorbar(self.widths, vals, yerr=self.std[layer], marker="o", ms=3, capsize=2, label=layer)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width")
        ax.set_ylabel("||dh|| / ||h||")
        ax.set_title(title if title is not None else self.name, fontsize=9)
        ax.legend(fontsize=7, frameon=False)
        ax.grid(alpha=0.3, which="both", lw=0.4)
        if fig is not None and path is not None:
            fig.savefig(path, dpi=90, bbox_inches="tight")
            plt.close(fig)
        return ax


def _call_with_base(factory, width, base):
    n = required_positional(factory, default=1)
    return factory(width, base) if n is not None and n >= 2 else factory(width)


def coord_check(
    optimizer: optax.GradientTransformation | Callable,
    widths: Sequence[int] = (64, 128, 256, 512, 1024),
    *,
    init: str = "spectral",
    steps: int = 3,
    depth: int = 2,
    d_in: int = 32,
    batch_size: int = 32,
    seeds: Sequence[int] = (0, 1, 2),
    data: tuple[np.ndarray, np.ndarray] | None = None,
    name: str = "",
    plot: str | None = None,
) -> CoordCheck:
    """Coordinate check: relative activation change per layer across widths.

    Trains the bias-free ReLU MLP of
    :func:`~spectral_optax.diagnostics.coord_check_mlp` (``d_in ->
    width x depth -> 1``) for ``steps`` full-batch steps of the mean squared
    error ``0.5 (f - y)^2`` on a fixed batch, then measures
    ``||h_t - h_0||_F / ||h_0||_F`` on that batch for every hidden layer (and
    the RMS output change ``rms(f_t - f_0)``), averaged over ``seeds``. Under muP / the spectral condition
    each row of the table is flat in width; under the standard
    parametrization with one learning rate it grows.

    Args:
      optimizer: an ``optax.GradientTransformation`` (same at every width) or
        a factory ``width -> transform`` or ``(width, base_params) -> transform``,
        where ``base_params`` are the model's parameter shapes at
        ``widths[0]`` (e.g. ``lambda n, base: so.mup_sgd(0.1, base=base)``).
      widths: widths to compare (increasing).
      init: ``'spectral'`` (Parametrization 1) or ``'standard'`` (Kaiming, SP).
      steps: optimizer steps.
      depth: number of hidden layers.
      d_in: input dimension (ignored when ``data`` is given).
      batch_size: examples in the fixed batch (ignored when ``data`` is given).
      seeds: initialization seeds to average over.
      data: ``(x, y)`` with ``x: (batch, d_in)``, ``y: (batch,)``; default a
        fixed Gaussian batch with +-1 targets.
      name: label for the table and plot.
      plot: save a log-log plot there when given.

    Returns:
      a :class:`~spectral_optax.diagnostics.CoordCheck` (``.table``, ``.ratio(layer)``, ``.format()``,
      ``.plot()``).
    """
    widths = [int(w) for w in widths]
    if data is None:
        kx, ky = jax.random.split(jax.random.key(1234))
        x = jax.random.normal(kx, (batch_size, d_in), jnp.float32)
        y = jnp.where(jax.random.bernoulli(ky, 0.5, (batch_size,)), 1.0, -1.0)
    else:
        x, y = jnp.asarray(data[0], jnp.float32), jnp.asarray(data[1], jnp.float32)
        d_in = x.shape[-1]
    base_init, _ = coord_check_mlp(widths[0], depth=depth, d_in=d_in, init=init)
    base = jax.eval_shape(base_init, jax.random.key(0))
    seeds_arr = jnp.asarray(list(seeds), jnp.uint32)
    table: dict[str, list[float]] = {}
    std: dict[str, list[float]] = {}
    for width in widths:
        init_fn, features_fn = coord_check_mlp(width, depth=depth, d_in=d_in, init=init)
        opt = (
            optimizer
            if isinstance(optimizer, optax.GradientTransformation)
            else _call_with_base(optimizer, width, base)
        )

        def loss_fn(params):
            f = features_fn(params, x)["out"][:, 0]
            return 0.5 * jnp.mean((f - y) ** 2)

        def run(seed):
            params0 = init_fn(jax.random.key(seed))

            def step(carry, _):
                params, state = carry
                grads = jax.grad(loss_fn)(params)
                updates, state = opt.update(grads, state, params)
                return (optax.apply_updates(params, updates), state), None

            (params, _), _ = jax.lax.scan(step, (params0, opt.init(params0)), None, length=steps)
            new, old = features_fn(params, x), features_fn(params0, x)
            change = relative_feature_change(
                {k: v for k, v in new.items() if k != "out"},
                {k: v for k, v in old.items() if k != "out"},
            )
            # The output starts near 0 under muP (f_0 ~ n^-1/2), so its change is
            # absolute: RMS over the batch of f_t - f_0.
            change["out"] = jnp.sqrt(jnp.mean((new["out"] - old["out"]) ** 2))
            return change

        changes = jax.device_get(jax.jit(jax.vmap(run))(seeds_arr))
        for layer, vals in changes.items():
            vals = np.asarray(vals, float)
            vals = np.where(np.isfinite(vals), vals, np.inf)
            table.setdefault(layer, []).append(float(np.mean(vals)))
            std.setdefault(layer, []).append(float(np.std(vals)) if np.all(np.isfinite(vals)) else float("nan"))
    order = sorted((k for k in table if k != "out"), key=lambda k: int(k[1:])) + ["out"]
    result = CoordCheck(widths, {k: table[k] for k in order}, {k: std[k] for k in order}, steps, name)
    if plot is not None:
        result.plot(plot)
    return result


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


__all__ += ["init_alignment", "mlp_batch_gradient", "outer_product_sum"]


# The weight-only bound on attention logits (docs/math.md, "QK-clip"); defined with qk_clip.
from spectral_optax._transforms.qk_clip import qk_logit_bound  # noqa: E402

__all__ += ["qk_logit_bound"]
