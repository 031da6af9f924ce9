"""The geometry of one parameter: which axes are fan-in, fan-out and batch.

A Flax layer computes ``y = x @ W``. Every axis of a weight is either a
**fan-in axis** (contracted with the layer input), a **fan-out axis** (produces
the output) or a **batch axis** (every other axis: layers stacked by
``nn.scan`` / ``nnx.vmap``, experts, heads treated separately). Each batch slice
is an independent matrix of shape ``(d_in, d_out)`` with ``d_in`` the product
of the fan-in dimensions and ``d_out`` the product of the fan-out dimensions.

Every rule of the package (initializers, dual maps, learning-rate
multipliers) reads a :class:`Geometry` and works on the canonical view
``to_matrix(x, geometry) -> (num_slices, d_in, d_out)``; no other module makes
a shape decision.

Kinds:
  * ``'matrix'``: a dense map between hidden vectors measured in RMS norm.
    Target spectral norm ``sqrt(d_out / d_in)``.
  * ``'embedding'``: a table indexed by a one-hot input (l1 -> RMS): each
    token's fan-out vector has RMS Theta(1); the effective input width is 1.
  * ``'vector'``: biases and norm scales, a matrix fed by a constant input of
    width 1 (``d_in = 1``), so its target is RMS 1.
  * ``'elementwise'``: a leaf no rule could decide (the documented fallback,
    see :class:`~spectral_optax.GeometryMap`): every entry is its own ``1 x 1`` slice
    (``to_matrix`` gives ``(size, 1, 1)``), so each optimizer sends it to its
    element-wise route (AdamW in ``muon``, sign in ``moga``, per-entry
    normalization in ``spectral_sgd``, plain SGD / Adam steps in the muP
    optimizers).

Roles: ``'hidden'`` (default), ``'output'`` (the read-out / head layer, which
some optimizers treat differently). Inferred from names, overridable.

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning".
  docs/math.md section 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

KINDS = ("matrix", "embedding", "vector")
#: The fallback kind of a leaf no rule decides (not a layer type: no dual map of its own).
ELEMENTWISE = "elementwise"
ALL_KINDS = KINDS + (ELEMENTWISE,)
ROLES = ("hidden", "output")


class GeometryError(ValueError):
    """A parameter whose geometry cannot be decided, or an invalid override."""


class UndecidableGeometryError(GeometryError):
    """No rule decides a leaf's geometry (raised with ``strict=True``; otherwise
    the leaf falls back to ``'elementwise'`` with a :class:`~spectral_optax.GeometryWarning`)."""


class GeometryWarning(UserWarning):
    """A leaf fell back to the ``'elementwise'`` geometry (no rule decided it)."""


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How one parameter array acts as a (batch of) linear map(s).

    Attributes:
      shape: the parameter's shape.
      kind: ``'matrix'``, ``'embedding'``, ``'vector'`` or ``'elementwise'``
        (no fan axes: every entry is a batch slice of size ``1 x 1``).
      fan_in_axes: axes contracted with the layer input (empty for vectors).
      fan_out_axes: axes that produce the layer output.
      fan_out_splits: the fan-out dimension is the concatenation of this many
        equal blocks, each an independent matrix (a fused QKV kernel: 3).
      role: ``'hidden'`` or ``'output'`` (the read-out layer).
    Axes in neither ``fan_in_axes`` nor ``fan_out_axes`` are batch axes.
    """

    shape: tuple[int, ...]
    kind: str = "matrix"
    fan_in_axes: tuple[int, ...] = ()
    fan_out_axes: tuple[int, ...] = ()
    fan_out_splits: int = 1
    role: str = "hidden"

    def __post_init__(self):
        shape = tuple(int(s) for s in self.shape)
        ndim = len(shape)
        norm = lambda axes: tuple(sorted(int(a) % ndim if ndim else int(a) for a in axes))
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "fan_in_axes", norm(self.fan_in_axes))
        object.__setattr__(self, "fan_out_axes", norm(self.fan_out_axes))
        if self.kind not in ALL_KINDS:
            raise GeometryError(f"kind must be one of {ALL_KINDS}, got {self.kind!r}")
        if self.role not in ROLES:
            raise GeometryError(f"role must be one of {ROLES}, got {self.role!r}")
        both = set(self.fan_in_axes) & set(self.fan_out_axes)
        if both or any(not 0 <= a < max(ndim, 1) for a in self.fan_in_axes + self.fan_out_axes):
            raise GeometryError(
                f"invalid axes for shape {shape}: fan_in_axes={self.fan_in_axes}, "
                f"fan_out_axes={self.fan_out_axes} (must be distinct axes of the array)"
            )
        if self.kind == ELEMENTWISE and (self.fan_in_axes or self.fan_out_axes):
            raise GeometryError(f"an 'elementwise' geometry has no fan axes (shape {shape})")
        if self.kind == "matrix" and ndim and not self.fan_in_axes:
            raise GeometryError(f"a 'matrix' needs at least one fan-in axis (shape {shape})")
        if self.kind not in ("vector", ELEMENTWISE) and ndim and not self.fan_out_axes:
            raise GeometryError(f"a {self.kind!r} needs at least one fan-out axis (shape {shape})")
        if self.fan_out_splits < 1 or self._d(self.fan_out_axes) % self.fan_out_splits:
            raise GeometryError(
                f"fan_out_splits={self.fan_out_splits} does not divide the fan-out size "
                f"{self._d(self.fan_out_axes)} (shape {shape})"
            )

    def _d(self, axes):
        return int(math.prod(self.shape[a] for a in axes))

    # ---- derived sizes ----------------------------------------------------
    @property
    def batch_axes(self) -> tuple[int, ...]:
        used = set(self.fan_in_axes) | set(self.fan_out_axes)
        return tuple(a for a in range(len(self.shape)) if a not in used)

    @property
    def d_in(self) -> int:
        """Product of the fan-in dimensions (1 for vectors)."""
        return self._d(self.fan_in_axes)

    @property
    def d_out(self) -> int:
        """Fan-out size of one matrix (per split block)."""
        return self._d(self.fan_out_axes) // self.fan_out_splits

    @property
    def input_width(self) -> int:
        """Effective input width used by every width rule.

        ``d_in`` for matrices; 1 for embeddings (one-hot input, l1 norm 1) and
        vectors (constant input of width 1).
        """
        return self.d_in if self.kind == "matrix" else 1

    @property
    def num_slices(self) -> int:
        """The number of independent matrices (batch slices times split blocks)."""
        return self._d(self.batch_axes) * self.fan_out_splits

    @property
    def target_spectral_norm(self) -> float:
        """``sqrt(d_out / input_width)``: the spectral condition's target."""
        return math.sqrt(self.d_out / self.input_width)

    # ---- constructors -----------------------------------------------------
    @classmethod
    def matrix(cls, shape, fan_in_axes=(-2,), fan_out_axes=(-1,), **kw) -> Geometry:
        return cls(tuple(shape), "matrix", tuple(fan_in_axes), tuple(fan_out_axes), **kw)

    @classmethod
    def embedding(cls, shape, fan_in_axes=None, fan_out_axes=(-1,), **kw) -> Geometry:
        ndim = len(shape)
        fan_out = tuple(a % ndim for a in fan_out_axes)
        if fan_in_axes is None:
            fan_in_axes = tuple(a for a in range(ndim) if a not in fan_out)
        return cls(tuple(shape), "embedding", tuple(fan_in_axes), fan_out, **kw)

    @classmethod
    def vector(cls, shape, fan_out_axes=None, **kw) -> Geometry:
        if fan_out_axes is None:
            fan_out_axes = tuple(range(len(shape)))
        return cls(tuple(shape), "vector", (), tuple(fan_out_axes), **kw)

    @classmethod
    def elementwise(cls, shape, **kw) -> Geometry:
        """Every entry on its own (canonical view ``(size, 1, 1)``): the fallback kind."""
        return cls(tuple(shape), ELEMENTWISE, (), (), **kw)

    def replace(self, **kw) -> Geometry:
        return dataclasses.replace(self, **kw)


# --------------------------------------------------------------------------
# The canonical matrix view.
# --------------------------------------------------------------------------
def to_matrix(x: jax.Array, geometry: Geometry) -> jax.Array:
    """Reshape ``x`` (of ``geometry.shape``) to ``(num_slices, d_in, d_out)``.

    Batch axes (and fan-out split blocks) become the leading axis; vectors get
    ``d_in = 1``.

    Args:
      x: an array of shape ``geometry.shape``.
      geometry: its :class:`~spectral_optax.Geometry` (which axes are fan-in, fan-out and batch).

    Returns:
      ``(num_slices, d_in, d_out)``: each slice one independent matrix.
    """
    g = geometry
    perm = g.batch_axes + g.fan_in_axes + g.fan_out_axes
    x = jnp.transpose(x, perm) if perm != tuple(range(x.ndim)) else x
    batch = g._d(g.batch_axes)
    s = g.fan_out_splits
    x = x.reshape(batch, g.d_in, s, g.d_out)
    if s > 1:
        x = jnp.swapaxes(x, 1, 2)
    return x.reshape(batch * s, g.d_in, g.d_out)


def from_matrix(m: jax.Array, geometry: Geometry) -> jax.Array:
    """Inverse of :func:`~spectral_optax.expert.to_matrix`.

    Args:
      m: ``(num_slices, d_in, d_out)``, as :func:`~spectral_optax.expert.to_matrix` returns.
      geometry: the :class:`~spectral_optax.Geometry` it was made with.

    Returns:
      The array in the parameter's own shape ``geometry.shape``.
    """
    g = geometry
    batch = g._d(g.batch_axes)
    s = g.fan_out_splits
    m = m.reshape(batch, s, g.d_in, g.d_out)
    if s > 1:
        m = jnp.swapaxes(m, 1, 2)
    perm = g.batch_axes + g.fan_in_axes + g.fan_out_axes
    permuted_shape = tuple(g.shape[a] for a in perm)
    m = m.reshape(permuted_shape)
    if perm != tuple(range(len(perm))):
        m = jnp.transpose(m, [int(i) for i in np.argsort(perm)])
    return m


# --------------------------------------------------------------------------
# Paths.
# --------------------------------------------------------------------------
#: The key of an NNX variable's array inside its node (dropped from paths).
_VALUE_KEYS = ("value", "raw_value")


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def path_str(path: Sequence[Any]) -> str:
    """The '/'-joined key path of a leaf (a trailing NNX ``value`` is dropped)."""
    names = [_key_name(k) for k in path]
    while names and names[-1] in _VALUE_KEYS:
        names.pop()
    return "/".join(names)


def _leaves_with_paths(tree) -> list[tuple[str, Any]]:
    """``[(path_str(path), leaf)]`` for every leaf of ``tree``, in flattening order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(path_str(p), x) for p, x in flat]
