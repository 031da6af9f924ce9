"""Parametrization-1 initializers: weights that meet the spectral condition.

The spectral condition asks every weight to have spectral norm
``||W||_* = Theta(sqrt(d_out / d_in))`` (RMS -> RMS operator norm Theta(1)), so
that hidden vectors have Theta(1) entries at every width. Three Flax
initializers (``(key, shape, dtype) -> Array``, usable wherever
``flax.linen.initializers`` / ``jax.nn.initializers`` are) produce it:

* :func:`spectral_normal`: i.i.d. ``N(0, sigma^2)`` with
  ``sigma = gain / sqrt(d_in) * min(1, sqrt(d_out / d_in))``. By random-matrix
  theory ``||W||_* ~ sigma (sqrt(d_in) + sqrt(d_out))``, between 1x and 2x the
  target ``gain * sqrt(d_out / d_in)``.
* :func:`spectral_orthogonal`: a (Haar) semi-orthogonal matrix per slice scaled
  so that every singular value, hence ``||W||_*``, is exactly
  ``gain * sqrt(d_out / d_in)``.
* :func:`spectral_embedding`: an embedding table (input one-hot, effective
  ``d_in = 1``) with ``N(0, std^2)`` entries, Theta(1) at every width (Flax's
  default ``nn.Embed`` init has std ``1 / sqrt(features)``, which shrinks).

Biases: initialize them to zero, which is already Flax's default
``bias_init``; nothing here is needed for them.

Axes. The arguments mirror :func:`jax.nn.initializers.variance_scaling`:
``out_axis`` (default ``-1``) names the fan-out axes, ``batch_axis`` (default
``()``) names axes holding independent matrices (layers stacked in one array,
experts, heads), and every other axis is a fan-in axis. So a Dense kernel
``(in, out)`` has ``d_in = in``; a Conv kernel ``(*window, in, out)`` has
``d_in = window x in`` and ``d_out = out`` (``variance_scaling``'s ``fan_out``
multiplies the window in; here it does not, because the window is contracted
with the input); a DenseGeneral kernel ``(in, heads, head_dim)`` needs
``out_axis=(-2, -1)``. ``in_axis`` defaults to ``None`` ("every axis not in
``out_axis`` or ``batch_axis``"); when it is given it is checked, and axes
named in none of the three (a conv window) still join the fan-in, exactly as
``variance_scaling`` counts them in ``fan_in``. Hence ``d_in`` always equals
``variance_scaling``'s ``fan_in``, and ``spectral_normal(gain=g)`` coincides in
distribution with ``variance_scaling(g**2, 'fan_in', 'normal')`` on every
layer with ``d_out >= d_in``; it differs (smaller) exactly on the layers that
shrink the width, such as the read-out head.

Layers built with ``nn.scan`` / ``nnx.vmap`` call the initializer per layer
(the stacked axis is vmapped away), so nothing special is needed; pass
``batch_axis`` only when one call creates the stacked array itself.

Gain. The default ``gain=1.0`` makes :func:`spectral_orthogonal` hit the
spectral target exactly and makes :func:`spectral_normal` equal Flax's default
LeCun-normal scale on non-shrinking layers. For ReLU networks use
``gain=math.sqrt(2)`` (Kaiming's correction for ReLU halving the second
moment; docs/math.md's sigma0). Worked example (input 3072, hidden 4096, one
output, ``gain=sqrt(2)``): stds 0.0255, 0.0221, 0.000345.

Values are drawn in float32 (float64 if that is requested) and cast to the
requested dtype, so bf16 parameters are bf16 draws of the f32 distribution.

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning",
  Parametrization 1. Saxe, McClelland, Ganguli (2014), orthogonal init.
  docs/math.md section 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spectral_optax._geometry import Geometry, GeometryLike, from_matrix, map_with_geometry, to_matrix
from spectral_optax._numerics import safe_max_abs, top_singular_value
from spectral_optax._tied import tied_readout, tied_readout_multiplier, tied_readout_nnx

__all__ = [
    "spectral_normal",
    "spectral_orthogonal",
    "spectral_embedding",
    "spectral_normalized",
    "reinitialize",
    "tied_readout",
    "tied_readout_multiplier",
    "tied_readout_nnx",
]

Initializer = Callable[..., jax.Array]
Axes = int | Sequence[int] | None


# --------------------------------------------------------------------------
# Shared helpers.
# --------------------------------------------------------------------------
def _as_axes(axes: Axes) -> tuple[int, ...] | None:
    if axes is None:
        return None
    if isinstance(axes, (int, np.integer)):
        return (int(axes),)
    return tuple(int(a) for a in axes)


def _check_gain(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def _dtypes(dtype) -> tuple[jnp.dtype, jnp.dtype]:
    """(requested dtype, dtype to draw in: float32, or float64 if requested)."""
    dtype = jnp.dtype(jax.dtypes.canonicalize_dtype(jnp.float_ if dtype is None else dtype))
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"spectral_optax initializers produce real floating-point weights; got dtype {dtype}. "
            "Pass a float dtype (e.g. param_dtype=jnp.float32 or jnp.bfloat16)."
        )
    return dtype, jnp.promote_types(dtype, jnp.float32)


def _matrix_geometry(
    name: str,
    shape: tuple[int, ...],
    in_axis: Axes,
    out_axis: Axes,
    batch_axis: Axes,
    fan_out_splits: int,
) -> Geometry:
    """The Geometry of a weight from variance_scaling-style axes, or a clear error."""
    ndim = len(shape)
    given = f"{name} got shape {shape} with in_axis={in_axis}, out_axis={out_axis}, batch_axis={batch_axis}"
    fix = (
        "A weight needs at least 2 axes: fan-in axes (contracted with the input) and fan-out axes "
        "(out_axis, default -1); batch_axis names independent stacked matrices. E.g. Dense (in, out): "
        "defaults; Conv (*window, in, out): defaults; DenseGeneral (in, heads, head_dim): "
        "out_axis=(-2, -1); stacked (layers, in, out): batch_axis=0. For 1-D biases use zeros "
        "(flax's default bias_init); for embedding tables use spectral_embedding()."
    )
    if ndim < 2:
        raise ValueError(f"{given}: a {ndim}-D shape is not a matrix. {fix}")
    axes = {"in_axis": _as_axes(in_axis), "out_axis": _as_axes(out_axis), "batch_axis": _as_axes(batch_axis)}
    for key, ax in axes.items():
        if ax is None:
            continue
        bad = [a for a in ax if not -ndim <= a < ndim]
        if bad:
            raise ValueError(f"{given}: {key} {bad} out of range for a {ndim}-D shape. {fix}")
        if len({a % ndim for a in ax}) != len(ax):
            raise ValueError(f"{given}: {key} repeats an axis. {fix}")
    out = {a % ndim for a in axes["out_axis"] or ()}
    batch = {a % ndim for a in axes["batch_axis"] or ()}
    fan_in_given = set() if axes["in_axis"] is None else {a % ndim for a in axes["in_axis"]}
    for (ka, a), (kb, b) in (
        (("in_axis", fan_in_given), ("out_axis", out)),
        (("in_axis", fan_in_given), ("batch_axis", batch)),
        (("out_axis", out), ("batch_axis", batch)),
    ):
        if a & b:
            raise ValueError(f"{given}: {ka} and {kb} share axes {sorted(a & b)}. {fix}")
    if not out:
        raise ValueError(f"{given}: out_axis is empty. {fix}")
    # Every axis not fan-out or batch is fan-in (a conv window joins the fan-in).
    fan_in = tuple(a for a in range(ndim) if a not in out and a not in batch)
    if not fan_in:
        raise ValueError(f"{given}: no axis is left for the fan-in. {fix}")
    if fan_out_splits < 1 or math.prod(shape[a] for a in out) % fan_out_splits:
        raise ValueError(
            f"{given}: fan_out_splits={fan_out_splits} must be >= 1 and divide the fan-out size "
            f"{math.prod(shape[a] for a in out)} (e.g. 3 for a fused QKV kernel)."
        )
    return Geometry(shape, "matrix", fan_in, tuple(sorted(out)), fan_out_splits=fan_out_splits)


def _shape(shape) -> tuple[int, ...]:
    return tuple(int(s) for s in shape)


def _prepare(name, shape, dtype, in_axis, out_axis, batch_axis, fan_out_splits):
    """``(shape, output dtype, draw dtype, geometry)`` of one matrix initializer call."""
    shape = _shape(shape)
    out_dtype, draw_dtype = _dtypes(dtype)
    return shape, out_dtype, draw_dtype, _matrix_geometry(name, shape, in_axis, out_axis, batch_axis, fan_out_splits)


def _no_out_sharding(name: str, out_sharding) -> None:
    if out_sharding is not None:
        raise NotImplementedError(
            f"{name} does not take out_sharding; shard the result instead "
            "(e.g. jax.device_put or jax.sharding.reshard)."
        )


def _matrix_init(name: str, default_dtype, layout, draw, *, takes_out_sharding: bool = False) -> Initializer:
    """The ``init(key, shape, dtype, out_sharding)`` of one matrix initializer.

    ``layout`` is ``(in_axis, out_axis, batch_axis, fan_out_splits)``; ``draw(key, shape, geom,
    draw_dtype, out_sharding)`` returns the weights in the draw dtype, cast here to the output dtype.
    An empty shape gives zeros without a draw; ``out_sharding`` raises unless ``takes_out_sharding``.
    """

    def init(key, shape, dtype=default_dtype, out_sharding=None) -> jax.Array:
        if not takes_out_sharding:
            _no_out_sharding(name, out_sharding)
        shape, out_dtype, draw_dtype, geom = _prepare(name, shape, dtype, *layout)
        if math.prod(shape) == 0:
            return jnp.zeros(shape, out_dtype)
        return draw(key, shape, geom, draw_dtype, out_sharding).astype(out_dtype)

    return init


# --------------------------------------------------------------------------
# Initializers.
# --------------------------------------------------------------------------
def spectral_normal(
    *,
    gain: float = 1.0,
    in_axis: Axes = None,
    out_axis: Axes = -1,
    batch_axis: Axes = (),
    fan_out_splits: int = 1,
    dtype=None,
) -> Initializer:
    """Gaussian init with the spectral condition's std (Parametrization 1).

    Entries are i.i.d. ``N(0, sigma^2)`` with

        sigma = gain / sqrt(d_in) * min(1, sqrt(d_out / d_in)),

    ``d_in`` the product of the fan-in axes (a conv kernel's window x in) and
    ``d_out`` the product of ``out_axis`` (divided by ``fan_out_splits``). The
    resulting spectral norm is about ``sigma (sqrt(d_in) + sqrt(d_out))``,
    i.e. between 1x and 2x ``gain * sqrt(d_out / d_in)`` per batch slice.

    Args:
      gain: sigma0; 1.0 by default (``math.sqrt(2)`` for ReLU networks).
      in_axis: fan-in axes; ``None`` (default) means every axis not in
        ``out_axis`` / ``batch_axis``. Axes named nowhere also join the fan-in,
        as in ``jax.nn.initializers.variance_scaling``.
      out_axis: fan-out axis or axes (default ``-1``).
      batch_axis: axes of independent matrices (stacked layers, experts).
      fan_out_splits: the fan-out is this many independent equal blocks (3 for
        a fused QKV kernel); ``d_out`` is one block's size.
      dtype: default dtype of the weights (the call's ``dtype`` wins).

    Returns:
      ``init(key, shape, dtype=dtype) -> Array``.

    References:
      Yang, Simon, Bernstein (2023), Parametrization 1; docs/math.md section 2.
    """
    gain = _check_gain("gain", gain)
    return _matrix_init(
        "spectral_normal",
        dtype,
        (in_axis, out_axis, batch_axis, fan_out_splits),
        lambda key, w, geom, draw_dtype, out_sharding: _normal_draw(key, geom, gain, draw_dtype, out_sharding),
        takes_out_sharding=True,
    )


def _normal_draw(key, geom: Geometry, gain: float, draw_dtype, out_sharding=None) -> jax.Array:
    """i.i.d. ``N(0, sigma^2)``, ``sigma = gain / sqrt(d_in) * min(1, sqrt(d_out / d_in))`` (see spectral_normal)."""
    d_in, d_out = geom.d_in, geom.d_out
    std = gain / math.sqrt(d_in) * min(1.0, math.sqrt(d_out / d_in))
    z = jax.random.normal(key, geom.shape, draw_dtype, out_sharding=out_sharding)
    return z * jnp.asarray(std, draw_dtype)


def _orthogonal_draw(key, geom: Geometry, gain: float, draw_dtype) -> jax.Array:
    """``gain * sqrt(d_out / d_in) * Q`` per slice, ``Q`` Haar semi-orthogonal (see spectral_orthogonal)."""
    d_in, d_out = geom.d_in, geom.d_out
    tall = d_in >= d_out
    rows, cols = (d_in, d_out) if tall else (d_out, d_in)
    g = jax.random.normal(key, (geom.num_slices, rows, cols), draw_dtype)
    q, r = jnp.linalg.qr(g, mode="reduced")  # q: (slices, rows, cols)
    d = jnp.diagonal(r, axis1=-2, axis2=-1)
    q = q * jnp.where(d < 0, -1.0, 1.0).astype(draw_dtype)[..., None, :]
    m = q if tall else jnp.swapaxes(q, -1, -2)  # (slices, d_in, d_out)
    m = m * jnp.asarray(gain * math.sqrt(d_out / d_in), draw_dtype)
    return from_matrix(m, geom)


def spectral_orthogonal(
    *,
    gain: float = 1.0,
    in_axis: Axes = None,
    out_axis: Axes = -1,
    batch_axis: Axes = (),
    fan_out_splits: int = 1,
    dtype=None,
) -> Initializer:
    """Semi-orthogonal init with spectral norm exactly ``gain * sqrt(d_out / d_in)``.

    Each ``(d_in, d_out)`` slice of the canonical view (per batch index and
    fan-out split block) is ``gain * sqrt(d_out / d_in) * Q``, with ``Q`` a
    Haar-distributed semi-orthogonal matrix (orthonormal columns if
    ``d_in >= d_out``, orthonormal rows otherwise): the QR factor of a
    Gaussian matrix with the signs of ``diag(R)`` moved into ``Q``. All
    ``min(d_in, d_out)`` singular values equal the target, so the RMS -> RMS
    operator norm is exactly ``gain``.

    Args:
      gain: the RMS -> RMS operator norm of every slice (default 1.0, the
        spectral condition's target itself).
      in_axis: fan-in axes; ``None`` (default) means every axis not in
        ``out_axis`` / ``batch_axis``, as in :func:`spectral_normal`.
      out_axis: fan-out axis or axes (default ``-1``).
      batch_axis: axes of independent matrices (stacked layers, experts).
      fan_out_splits: the fan-out is this many independent equal blocks (3 for
        a fused QKV kernel); each block is its own semi-orthogonal matrix.
      dtype: default dtype of the weights (the call's ``dtype`` wins).

    Returns:
      ``init(key, shape, dtype=dtype) -> Array``.

    References:
      Yang, Simon, Bernstein (2023), Parametrization 1 (the orthogonal
      alternative); Saxe, McClelland, Ganguli (2014); docs/math.md section 2.
    """
    gain = _check_gain("gain", gain)
    return _matrix_init(
        "spectral_orthogonal",
        dtype,
        (in_axis, out_axis, batch_axis, fan_out_splits),
        lambda key, w, geom, draw_dtype, out_sharding: _orthogonal_draw(key, geom, gain, draw_dtype),
    )


def spectral_embedding(*, std: float = 1.0, dtype=None) -> Initializer:
    """Embedding-table init with Theta(1) entries: i.i.d. ``N(0, std^2)``.

    An embedding's input is one-hot (l1 norm 1, effective ``d_in = 1``), so the
    spectral condition (l1 -> RMS operator norm Theta(1)) asks each token's
    vector to have RMS Theta(1), independent of the width: ``std`` does not
    depend on the shape. For ``nn.Embed(embedding_init=...)`` /
    ``nnx.Embed(embedding_init=...)``, tables ``(vocab, features)``.

    Args:
      std: standard deviation of the entries (default 1.0).
      dtype: default dtype of the table (the call's ``dtype`` wins).

    Returns:
      ``init(key, shape, dtype=dtype) -> Array``.

    References:
      Yang, Simon, Bernstein (2023), section on embeddings; docs/math.md
      sections 1-2.
    """
    std = _check_gain("std", std)
    default_dtype = dtype

    def init(key, shape, dtype=default_dtype, out_sharding=None) -> jax.Array:
        shape = _shape(shape)
        out_dtype, draw_dtype = _dtypes(dtype)
        if len(shape) < 1:
            raise ValueError(
                f"spectral_embedding got shape {shape}: an embedding table needs at least one axis, "
                "typically (vocab, features)."
            )
        if math.prod(shape) == 0:
            return jnp.zeros(shape, out_dtype)
        z = jax.random.normal(key, shape, draw_dtype, out_sharding=out_sharding)
        return (z * jnp.asarray(std, draw_dtype)).astype(out_dtype)

    return init


# --------------------------------------------------------------------------
# Any initializer, rescaled to the spectral target.
# --------------------------------------------------------------------------
def spectral_normalized(
    base_init: Initializer,
    *,
    gain: float = 1.0,
    in_axis: Axes = None,
    out_axis: Axes = -1,
    batch_axis: Axes = (),
    fan_out_splits: int = 1,
    dtype=None,
) -> Initializer:
    """Any initializer, rescaled so that each matrix has spectral norm exactly the target.

    Draws ``W0 = base_init(key, shape, dtype)`` and returns, per ``(d_in, d_out)``
    slice of the canonical view (per batch index and fan-out split block),

        W = gain * sqrt(d_out / d_in) * W0 / ||W0||_*,

    with ``||W0||_*`` the exact largest singular value (SVD of the slice). The
    direction (every singular vector and the ratios between singular values)
    is the base initializer's; only the scale changes. This is the
    spectral-condition paper's alternative to Parametrization 1's Gaussian:
    "initialize as you like, then normalize the spectral norm".

    A slice that ``base_init`` draws as all zeros stays zero (it has no
    direction to rescale); non-finite draws raise.

    Args:
      base_init: a Flax / JAX initializer ``(key, shape, dtype) -> Array``,
        e.g. ``jax.nn.initializers.lecun_normal()``, ``orthogonal()``,
        ``uniform()``, or one of this module's.
      gain: target RMS -> RMS operator norm (1.0: the spectral condition's
        ``sqrt(d_out / d_in)`` itself).
      in_axis, out_axis, batch_axis, fan_out_splits: the weight's layout, as
        in :func:`spectral_normal`.
      dtype: default dtype of the weights (the call's ``dtype`` wins).

    Returns:
      ``init(key, shape, dtype=dtype) -> Array``.

    Cost: one SVD per slice at initialization (``O(d_in d_out min(d_in,
    d_out))``), seconds for a 4096 x 4096 kernel on a CPU.

    References:
      Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature
      Learning", section 3 (spectral scaling of the initialization).
    """
    if not callable(base_init):
        raise TypeError(
            f"spectral_normalized: base_init must be an initializer (key, shape, dtype) -> Array, "
            f"got {type(base_init).__name__}; e.g. spectral_normalized(jax.nn.initializers.lecun_normal())"
        )
    gain = _check_gain("gain", gain)

    def draw(key, shape, geom: Geometry, draw_dtype, out_sharding) -> jax.Array:
        w0 = jnp.asarray(base_init(key, shape, draw_dtype))
        if w0.shape != shape:
            raise ValueError(
                f"spectral_normalized: base_init returned shape {w0.shape} for requested shape {shape}; "
                "pass an initializer with the (key, shape, dtype) signature."
            )
        try:  # checked when concrete (not under jit)
            finite = bool(jnp.all(jnp.isfinite(w0)))
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError):
            finite = True
        if not finite:
            raise ValueError(f"spectral_normalized: base_init returned non-finite values for shape {shape}")
        m = to_matrix(w0.astype(draw_dtype), geom)  # (slices, d_in, d_out)
        m = m / safe_max_abs(m, axis=(-2, -1))  # scale-free: no overflow for huge draws
        top = top_singular_value(m, "svd")[:, None, None]  # exact ||W0||_* per slice
        target = jnp.asarray(gain * math.sqrt(geom.d_out / geom.d_in), draw_dtype)
        m = jnp.where(top > 0, m * (target / jnp.where(top > 0, top, 1.0)), 0.0)
        return from_matrix(m, geom)

    return _matrix_init("spectral_normalized", dtype, (in_axis, out_axis, batch_axis, fan_out_splits), draw)


# --------------------------------------------------------------------------
# A whole parameter tree, from its geometry.
# --------------------------------------------------------------------------
def reinitialize(
    key: jax.Array,
    params,
    geometry: GeometryLike = None,
    *,
    gain: float = 1.0,
    method: str = "normal",
    embedding_std: float = 1.0,
    warn_tied: bool = True,
):
    """Redraw every matrix and embedding of ``params`` per Parametrization 1.

    For a model whose initializers cannot be passed in (third-party code with
    a hard-wired ``kernel_init``): each leaf is redrawn from its decided
    :class:`~spectral_optax.Geometry` by the same rules as the per-layer
    initializers, with the right axes:

    * ``kind='matrix'``: :func:`spectral_normal` (``method='normal'``) or
      :func:`spectral_orthogonal` (``method='orthogonal'``) on the leaf's
      fan-in / fan-out / batch axes; stacked slices (batch axes) are
      independent draws and a fused kernel (``fan_out_splits``) is scaled per
      block (``d_out`` is one block's size);
    * ``kind='embedding'``: :func:`spectral_embedding` (``N(0, embedding_std^2)``);
    * vectors (biases, norm scales) and ``'elementwise'`` leaves (undecided):
      unchanged.

    A tied table (``kind='embedding'``, ``role='output'``: looked up and read
    out by ``embed.attend``, as the trace of ``GeometryMap.from_linen`` marks
    it) is drawn ``N(0, embedding_std^2)`` for the lookup, so the read-out
    ``h @ E^T`` needs the multiplier ``c / d`` in the forward pass, or the
    logits grow like ``sqrt(d)`` and the initial loss with the width: a
    ``UserWarning`` names the table, :func:`tied_readout` /
    :func:`tied_readout_nnx` and the multiplier
    (:func:`tied_readout_multiplier`; docs/guide.md, "A tied read-out").

    Every leaf keeps its dtype (drawn in float32 or float64 and cast, as the
    initializers do) and, for a concrete ``jax.Array``, its sharding. Each leaf
    gets its own key, ``fold_in(key, crc32(path))``, so a leaf's draw does not
    depend on the rest of the tree.

    Args:
      key: a PRNG key.
      params: the parameter tree (a Linen param dict, an ``nnx.State``, any pytree).
      geometry: how to read the leaves, see :func:`spectral_optax.as_geometry_map`;
        for third-party code pass :meth:`spectral_optax.GeometryMap.from_linen` /
        ``from_nnx`` / ``from_apply`` so that the trace decides every leaf.
      gain: sigma0 of the matrices (``math.sqrt(2)`` for ReLU networks).
      method: ``'normal'`` (Parametrization 1's Gaussian) or ``'orthogonal'``
        (every singular value of every slice exactly the target).
      embedding_std: standard deviation of the embedding entries.
      warn_tied: warn about a tied table (``False`` once the forward pass
        applies the read-out multiplier).

    Returns:
      A tree like ``params`` with the matrices and embeddings redrawn.

    References:
      Yang, Simon, Bernstein (2023), Parametrization 1; docs/math.md section 2.
    """
    import zlib

    if method not in ("normal", "orthogonal"):
        raise ValueError(f"reinitialize: method must be 'normal' or 'orthogonal', got {method!r}")
    gain = _check_gain("gain", gain)
    embedding_std = _check_gain("embedding_std", embedding_std)

    tied: dict[str, int] = {}

    def redraw(path: str, g: Geometry, x):
        if g.kind not in ("matrix", "embedding") or math.prod(g.shape) == 0:
            return x
        if g.kind == "embedding" and g.role == "output":
            tied[path] = g.d_out
        out_dtype, draw_dtype = _dtypes(x.dtype)
        k = jax.random.fold_in(key, zlib.crc32(path.encode()))
        if g.kind == "embedding":
            new = jax.random.normal(k, g.shape, draw_dtype) * jnp.asarray(embedding_std, draw_dtype)
        elif method == "normal":
            new = _normal_draw(k, g, gain, draw_dtype)
        else:
            new = _orthogonal_draw(k, g, gain, draw_dtype)
        new = new.astype(out_dtype)
        sharding = getattr(x, "sharding", None)
        if sharding is not None and isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            new = jax.device_put(new, sharding)
        return new

    out = map_with_geometry(redraw, geometry, params, with_path=True)
    if tied and warn_tied:
        import warnings

        path, d = next(iter(tied.items()))
        warnings.warn(
            f"reinitialize: '{path}' is a tied table (looked up and read out, width d = {d}) drawn "
            f"N(0, {embedding_std:g}^2): its read-out needs the multiplier c / d (c = 1: {1.0 / d:.4g}) in the "
            "forward pass, or the logits grow like sqrt(d) and the initial loss with the width. "
            "m = so.initializers.tied_readout_multiplier(params, geometry, base_width=c); Linen: "
            "`with so.initializers.tied_readout(m): model.apply(...)`; NNX: so.initializers.tied_readout_nnx(model, m) "
            "(docs/guide.md, 'A tied read-out'). Pass warn_tied=False once the model applies it.",
            UserWarning,
            stacklevel=2,
        )
    return out
