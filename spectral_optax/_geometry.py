"""Parameter geometry: the single source of truth for what each parameter is.

A Flax layer computes ``y = x @ W``. Every axis of a weight is either a
**fan-in axis** (contracted with the layer input), a **fan-out axis** (produces
the output) or a **batch axis** (every other axis: layers stacked by
``nn.scan`` / ``nnx.vmap``, experts, heads treated separately). Each batch slice
is an independent matrix of shape ``(d_in, d_out)`` with ``d_in`` the product
of the fan-in dimensions and ``d_out`` the product of the fan-out dimensions.

Every rule of the package (initializers, dual maps, learning-rate
multipliers) reads the geometry from here and works on the canonical view
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
    see :class:`GeometryMap`): every entry is its own ``1 x 1`` slice
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
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

KINDS = ("matrix", "embedding", "vector")
#: The fallback kind of a leaf no rule decides (not a layer type: no dual map of its own).
ELEMENTWISE = "elementwise"
ALL_KINDS = KINDS + (ELEMENTWISE,)
ROLES = ("hidden", "output")

# Leaf / module names recognised by the inference rules.
_OUTPUT_NAME = re.compile(
    r"^(head|lm_head|output|output_layer|readout|logits|classifier|unembed|unembedding|out_proj_head|final"
    r"|logit_?dense|logits?_(dense|proj|layer)|cls_head|classifier_head|prediction_head)"
    r"(_\d+)?$",
    re.IGNORECASE,
)
# Hugging Face GPT-2's FlaxConv1D layers: kernels stored (features, in), used as x @ kernel.T.
_GPT2_CONV1D_NAME = re.compile(r"^(c_attn|c_fc|c_proj)$")
# Gemma's einsum weights: (leaf or parent name) -> (fan-in, fan-out) axes counted from the end; every
# other axis (the stacked key/value or gate axis, and any layer axis before it) is a batch axis.
_GEMMA_EINSUM = {
    "q_einsum": ((-2,), (-3, -1)),  # (N, D, H): 'BTD,NDH->BTNH'
    "kv_einsum": ((-2,), (-3, -1)),  # (2, K, D, H): 'BSD,CKDH->CBSKH'
    "qkv_einsum": ((-2,), (-3, -1)),  # (3, N, D, H): 'BTD,SNDH->SBTNH'
    "attn_vec_einsum": ((-3, -2), (-1,)),  # (N, H, D): 'BTNH,NHD->BTD'
}
_GEMMA_MIN_NDIM = {"q_einsum": 3, "kv_einsum": 4, "qkv_einsum": 4, "attn_vec_einsum": 3}
_DENSE_NAME = re.compile(r"^(dense|linear)(_\d+)?$", re.IGNORECASE)
_CONV_NAME = re.compile(r"conv", re.IGNORECASE)
# nn.ConvLocal: a separate filter per output position, kernel (*out_positions, window x in, out).
_CONV_LOCAL_NAME = re.compile(r"^conv_?local(_\d+)?$", re.IGNORECASE)
# Llama-style fused projections, often grouped-query (q, k, v blocks of different widths).
_GQA_FUSED_NAME = re.compile(r"^wqkv$", re.IGNORECASE)
# Flax's default name of a Dense layer (the read-out of a classifier that does not name its head).
_DEFAULT_DENSE_NAME = re.compile(r"^Dense_(\d+)$")
_QKV_NAME = re.compile(r"^(query|key|value)$", re.IGNORECASE)
# A fused query/key/value projection: its fan-out is three independent blocks.
_FUSED_QKV_NAME = re.compile(r"^(qkv|qkv_proj|c_attn|wqkv)$", re.IGNORECASE)
_VALUE_KEYS = ("value", "raw_value")


class GeometryError(ValueError):
    """A parameter whose geometry cannot be decided, or an invalid override."""


class UndecidableGeometryError(GeometryError):
    """No rule decides a leaf's geometry (raised with ``strict=True``; otherwise
    the leaf falls back to ``'elementwise'`` with a :class:`GeometryWarning`)."""


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
      geometry: its :class:`Geometry` (which axes are fan-in, fan-out and batch).

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
    """Inverse of :func:`to_matrix`.

    Args:
      m: ``(num_slices, d_in, d_out)``, as :func:`to_matrix` returns.
      geometry: the :class:`Geometry` it was made with.

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
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(path_str(p), x) for p, x in flat]


# --------------------------------------------------------------------------
# Layout hints from Flax modules.
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Layout:
    """Natural trailing layout of a module's weight: ``n_in`` fan-in axes then
    ``n_out`` fan-out axes; extra leading axes are batch (stacked) axes."""

    kind: str
    n_in: int
    n_out: int
    role: str = "hidden"
    #: Explicit (fan_in, fan_out) axes (an einsum's kernel), instead of the trailing layout.
    axes: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    #: Why the hint may be wrong where no trace checks it (warned when it decides alone).
    doubt: str | None = None


def _einsum_layout(eq: str) -> _Layout | None:
    """An einsum kernel's axes: letters shared with the input only are fan-in,
    with the output only fan-out, with both batch (``'BTD,NDH->BTNH'``: fan-in
    ``D``, fan-out ``N, H``)."""
    try:
        lhs, out = eq.replace(" ", "").split("->")
        x, w = lhs.split(",")
    except ValueError:
        return None
    x, w, out = (t.replace("...", "") for t in (x, w, out))
    if len(set(w)) != len(w):
        return None
    fan_in = tuple(i for i, c in enumerate(w) if c in x and c not in out)
    fan_out = tuple(i for i, c in enumerate(w) if c in out and c not in x)
    if not fan_in or not fan_out or any(c not in x and c not in out for c in w):
        return None
    doubt = None
    if len(fan_out) > 1:
        letters = ", ".join(w[i] for i in fan_out)
        doubt = (
            f"the einsum {eq!r} gives the weight {len(fan_out)} output axes ({letters}), and whether one of them "
            "is a stack whose blocks are used separately after the product (key / value, gate / up: a batch "
            "axis) or part of the fan-out (heads) only the forward pass shows"
        )
    return _Layout("matrix", len(fan_in), len(w) - len(fan_in), axes=(fan_in, fan_out), doubt=doubt)


def _module_layouts(type_name: str, attrs: Mapping[str, Any]) -> dict[str, _Layout]:
    """Layouts of a Flax module's parameters by leaf name (Linen and NNX)."""

    def as_tuple(v):
        return tuple(v) if isinstance(v, (tuple, list)) else (v,)

    t = type_name
    if t in ("Dense", "Linear", "ConvLocal"):
        # ConvLocal's kernel (*out_positions, window x in, out): one matrix per position.
        return {"kernel": _Layout("matrix", 1, 1), "bias": _Layout("vector", 0, 1)}
    if t == "Einsum":
        lay_e = _einsum_layout(attrs["einsum_str"]) if isinstance(attrs.get("einsum_str"), str) else None
        return {} if lay_e is None else {"kernel": lay_e}
    if t in ("DenseGeneral", "LinearGeneral"):
        if "in_features" in attrs:  # NNX
            n_in = len(as_tuple(attrs["in_features"]))
            n_out = len(as_tuple(attrs["out_features"]))
        else:
            n_in = len(as_tuple(attrs.get("axis", -1)))
            n_out = len(as_tuple(attrs.get("features")))
        return {"kernel": _Layout("matrix", n_in, n_out), "bias": _Layout("vector", 0, n_out)}
    if t in ("Conv", "ConvTranspose"):
        window = attrs.get("kernel_size")
        n_window = len(as_tuple(window)) if window is not None else None
        if n_window is None:
            return {}
        return {"kernel": _Layout("matrix", n_window + 1, 1), "bias": _Layout("vector", 0, 1)}
    if t == "Embed":
        return {"embedding": _Layout("embedding", 1, 1)}
    if t in ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm"):
        return {"scale": _Layout("vector", 0, 1), "bias": _Layout("vector", 0, 1)}
    return {}


_MODULE_ATTRS = ("in_features", "out_features", "axis", "features", "kernel_size", "einsum_str")


def _attrs_of(module) -> dict[str, Any]:
    out = {}
    for a in _MODULE_ATTRS:
        try:
            v = getattr(module, a)
        except Exception:  # noqa: BLE001 - unbound Linen attributes may raise
            continue
        if v is not None and not callable(v) and not isinstance(v, (jax.Array, np.ndarray)):
            out[a] = v
    return out


def _hints_from_nnx(module) -> dict[tuple[str, ...], dict[str, _Layout]]:
    from flax import nnx

    hints = {}
    for path, node in nnx.graph.iter_graph(module):
        if isinstance(node, nnx.Module):
            lay = _module_layouts(type(node).__name__, _attrs_of(node))
            if lay:
                hints[tuple(str(p) for p in path)] = lay
    return hints


def _linen_hint_recorder():
    """``(hints, interceptor)``: run a Linen module under ``nn.intercept_methods(interceptor)`` to
    record the layout hints of every module it calls."""
    hints: dict[tuple[str, ...], dict[str, _Layout]] = {}

    def interceptor(next_fun, call_args, call_kwargs, context):
        m = context.module
        path = tuple(str(p) for p in m.path)
        if path and path not in hints:
            lay = _module_layouts(type(m).__name__, _attrs_of(m))
            if lay:
                hints[path] = lay
        return next_fun(*call_args, **call_kwargs)

    return hints, interceptor


def _linen_init_trace(module, rngs, args, kwargs):
    """One ``jax.jit`` trace of ``module.init(rngs, *args, **kwargs)``, hints recorded: ``(hints, InitTrace)``."""
    import flax.linen as nn

    from spectral_optax._trace import trace_init

    def init(r, *a, **kw):
        y, variables = module.init_with_output(r, *a, **kw)
        variables = dict(variables)
        params = variables.pop("params", {})
        return y, params, variables

    hints, interceptor = _linen_hint_recorder()
    with nn.intercept_methods(interceptor):
        tr = trace_init(init, rngs, *args, **kwargs)
    return hints, tr


def _linen_apply_trace(module, variables, args, kwargs):
    """The decisions of a trace of ``module.apply`` on ``variables`` (arrays or shapes)."""
    from spectral_optax._trace import trace_geometry

    others = [c for c in variables if c != "params"]

    def apply(p, collections, *a, **kw):
        out = module.apply(
            {**collections, "params": p}, *a, rngs={"dropout": jax.random.key(0)}, mutable=others or False, **kw
        )
        return out[0] if others else out  # the model's output, not the updated batch statistics

    rest = {c: variables[c] for c in others}
    return trace_geometry(apply, variables.get("params", {}), rest, *args, **kwargs)


def _linen_decisions(module, tr, args, kwargs):
    """The init trace's decisions; the parameters it cannot place come from a trace of ``apply``."""
    traced = dict(tr.decisions())
    if tr.unmapped:
        params, rest = tr.traced.out_info  # shapes only
        applied = _linen_apply_trace(module, {"params": params, **rest}, args, kwargs)
        traced.update({p: applied[p] for p in tr.unmapped if p in applied})
    return traced


def _trace_or_warn(trace_fn, *args, **kwargs):
    """The trace's decisions, or ``None`` with a :class:`GeometryWarning` if the model does not trace."""
    try:
        return trace_fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the module hints still decide
        warnings.warn(
            f"could not trace the model's forward pass ({type(e).__name__}: {e}); geometry from module "
            "hints and name rules only.",
            GeometryWarning,
            stacklevel=3,
        )
        return None


# --------------------------------------------------------------------------
# Overrides.
# --------------------------------------------------------------------------
Override = Any  # Geometry | str kind | Mapping of Geometry fields | Callable[(path, shape), Geometry]


def _apply_override(override: Override, path: str, shape: tuple[int, ...]) -> Geometry:
    if isinstance(override, Geometry):
        if override.shape != shape:
            raise GeometryError(
                f"override for parameter '{path}' has shape {override.shape}, but the parameter has shape {shape}"
            )
        return override
    if callable(override):
        g = override(path, shape)
        return _apply_override(g, path, shape)
    if isinstance(override, str):
        override = {"kind": override}
    if isinstance(override, Mapping):
        fields = dict(override)
        kind = fields.pop("kind", "matrix")
        ndim = len(shape)
        try:
            if kind == "vector":
                return Geometry.vector(shape, **fields)
            if kind == "embedding":
                return Geometry.embedding(shape, **fields)
            if kind == ELEMENTWISE:
                return Geometry.elementwise(shape, **fields)
            if ndim < 2 and "fan_in_axes" not in fields:
                raise GeometryError("a matrix needs >= 2 axes or explicit fan_in_axes")
            fields.setdefault("fan_in_axes", (-2,))
            fields.setdefault("fan_out_axes", (-1,))
            return Geometry(shape, "matrix", **fields)
        except (GeometryError, TypeError) as e:
            raise GeometryError(f"invalid geometry override for parameter '{path}' {shape}: {e}") from e
    raise GeometryError(
        f"override for parameter '{path}' must be a Geometry, a kind string, a dict of Geometry "
        f"fields or a callable (path, shape) -> Geometry; got {type(override).__name__}"
    )


def _compile_overrides(overrides: Mapping[str, Override]) -> list:
    out = []
    for k, v in overrides.items():
        try:
            out.append((re.compile(k), v))
        except re.error as e:
            raise GeometryError(
                f"geometry override {k!r} is not a valid regular expression ({e}); overrides map a regex "
                "re.search-ed on the '/'-joined parameter path to a Geometry, a kind or a dict of fields"
            ) from e
    return out


def _override_help(path: str, shape: tuple[int, ...]) -> str:
    pattern = "/".join(path.split("/")[-2:]) + "$"
    return (
        "Fix it with an override, matched by regex on the '/'-joined path, e.g.\n"
        f"    geometry={{r'{pattern}': dict(kind='matrix', fan_in_axes=(-2,), fan_out_axes=(-1,))}}\n"
        "  (axes in neither list are batch axes: stacked layers, heads, experts), or\n"
        f"    geometry={{r'{pattern}': spectral_optax.Geometry.vector({shape})}},\n"
        "  or let the model tell: spectral_optax.GeometryMap.from_linen(model, x) / "
        "GeometryMap.from_nnx(model, x) / GeometryMap.from_apply(apply_fn, params, x)."
    )


# --------------------------------------------------------------------------
# The resolver.
# --------------------------------------------------------------------------
class GeometryMap:
    """Decides the :class:`Geometry` of every leaf of a parameter tree.

    Resolution order for a leaf with '/'-joined path ``path``:
      1. the first override whose regex ``re.search``-es ``path``;
      2. an exact entry of an explicit geometry tree;
      3. the traced computation (:meth:`from_apply`, and :meth:`from_linen` /
         :meth:`from_nnx` with example inputs): the primitives that consume
         the parameter decide it (see ``spectral_optax._trace``);
      4. a layout hint recorded from the Flax model (``from_linen`` /
         ``from_nnx``), which knows Dense / DenseGeneral / Conv / ConvLocal /
         Embed / Einsum (by its equation) / norms and treats extra leading
         axes as stacked-layer batch axes: the trace's cross-check, and the
         fallback where the trace cannot decide;
      5. naming conventions (``kernel``, ``embedding``, ``bias``, ``scale``,
         module names such as ``Dense_0``, ``Conv_1``, ``query``, Hugging Face
         GPT-2's ``c_attn`` / ``c_fc`` / ``c_proj``, Gemma's einsum weights).

    A leaf the trace sees but cannot decide (an opaque primitive, uses that
    disagree, blocks a Geometry cannot express) takes the module hint if there
    is one, else the element-wise fallback below (never a name rule that the
    computation may contradict). :meth:`decided_by` (and ``describe()``'s
    ``decided_by`` column) says which rule decided each leaf.

    A leaf no rule covers (e.g. a 3-D leaf ``'w'`` of a plain pytree) falls
    back to ``Geometry.elementwise(shape)`` with a :class:`GeometryWarning`
    naming its path and the override that fixes it: every named optimizer
    has an element-wise route for it (as ``optax.contrib.muon`` sends non-2-D
    leaves to Adam). With ``strict=True`` such a leaf raises
    :class:`GeometryError` instead. The decision is made once per leaf, here.

    Args:
      overrides: ``{regex: override}``: an override (a :class:`Geometry`, a kind
        name, or a dict of :class:`Geometry` fields) for every leaf whose path
        the regex ``re.search``-es (rule 1).
      tree: an explicit geometry tree: leaves of :class:`Geometry` nested like
        the params they describe (rule 2).
      hints: layout hints by module path, as recorded by :meth:`from_linen` /
        :meth:`from_nnx` (rule 4; rarely given by hand).
      strict: raise :class:`GeometryError` instead of the element-wise fallback.
      traced: per-path decisions of a traced computation (rule 3), as
        :meth:`from_apply` records them (rarely given by hand).
    """

    def __init__(
        self,
        overrides: Mapping[str, Override] | None = None,
        *,
        tree: Any = None,
        hints: Mapping[tuple[str, ...], Mapping[str, _Layout]] | None = None,
        strict: bool = False,
        traced: Mapping[str, Any] | None = None,
    ):
        self.strict = bool(strict)
        self.traced = dict(traced or {})
        self.overrides = _compile_overrides(overrides or {})
        self.explicit: dict[str, Geometry] = {}
        if tree is not None:
            flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, Geometry))
            for p, g in flat:
                if isinstance(g, Geometry):
                    self.explicit[path_str(p)] = g
        self.hints = dict(hints or {})
        self._cache: dict[tuple, tuple[Geometry, ...]] = {}
        self._decided: dict[tuple[str, tuple[int, ...]], Geometry] = {}
        self._how: dict[tuple[str, tuple[int, ...]], str] = {}
        self._checked: set[tuple[str, ...]] = set()

    # -- constructors from models -------------------------------------------
    @classmethod
    def from_apply(
        cls, apply_fn: Callable, params, *example_args, overrides=None, strict: bool = False, **example_kwargs
    ) -> GeometryMap:
        """Geometry read off the computation: trace ``apply_fn(params, *example_args)``.

        ``jax.make_jaxpr`` on abstract inputs (shapes only, no FLOPs); each
        parameter is decided by the primitives that consume it (``dot_general``
        contracted dims fan-in, ``conv_general_dilated``, ``gather`` lookups,
        element-wise biases and scales, ``scan`` stacks, fused blocks split before
        or after the product) and the read-out role by what reaches the output.
        See docs/guide.md for the rules; :func:`~spectral_optax.describe` shows how
        each leaf was decided.

        Args:
          apply_fn: ``(params, *example_args, **example_kwargs) -> outputs``.
          params: the parameter tree the optimizer will see (arrays or
            ``jax.ShapeDtypeStruct``; no values are read).
          *example_args: example inputs (arrays or ``jax.ShapeDtypeStruct``).
          overrides: ``{regex: override}``, applied before the trace.
          strict: raise instead of the element-wise fallback for undecided leaves.
          **example_kwargs: keyword inputs of ``apply_fn``.

        Raises:
          GeometryError: ``apply_fn`` could not be traced on abstract inputs.
        """
        from spectral_optax._trace import trace_geometry

        try:
            traced = trace_geometry(apply_fn, params, *example_args, **example_kwargs)
        except Exception as e:  # noqa: BLE001 - any tracing failure, reported with its cause
            raise GeometryError(
                f"GeometryMap.from_apply could not trace apply_fn on abstract inputs ({type(e).__name__}: {e}). "
                "apply_fn(params, *example_args) must be traceable by jax.make_jaxpr (no Python control flow "
                "on values); otherwise use GeometryMap.from_linen / from_nnx hints or overrides."
            ) from e
        return cls(overrides, strict=strict, traced=traced)

    @classmethod
    def from_nnx(cls, module, *example_args, overrides=None, strict: bool = False, **example_kwargs) -> GeometryMap:
        """Layouts read from a live ``flax.nnx`` module; traced when example inputs are given.

        Args:
          module: the ``nnx.Module``.
          *example_args: example inputs of ``module(*example_args)``; with them the
            forward pass is traced as in :meth:`from_apply` (the trace decides,
            the module hints are the cross-check and the fallback).
          overrides: ``{regex: override}``, applied first.
          strict: raise instead of the element-wise fallback for undecided leaves.
          **example_kwargs: keyword inputs of the module call.
        """
        hints = _hints_from_nnx(module)
        traced = None
        if not (example_args or example_kwargs):
            from flax import nnx

            paths = [p for p, _ in _leaves_with_paths(nnx.state(module, nnx.Param))]
            if paths and not any(_is_output_path(p) for p in paths):
                warnings.warn(
                    f"GeometryMap.from_nnx({type(module).__name__}) without example inputs: no module is named as "
                    "a read-out (head, lm_head, logits, readout, classifier, ...), so every matrix gets role "
                    "'hidden'; a head under another name is seen only by the trace. Pass example inputs "
                    "(GeometryMap.from_nnx(model, x)) or an override, e.g. "
                    "geometry={r'<head>/kernel$': dict(kind='matrix', role='output')}.",
                    GeometryWarning,
                    stacklevel=2,
                )
        if example_args or example_kwargs:
            from flax import nnx

            from spectral_optax._trace import trace_geometry

            parts: Any = nnx.split(module, nnx.Param, ...)
            graphdef, state, rest = parts

            def apply(p, *a, **kw):
                return nnx.merge(graphdef, p, rest)(*a, **kw)

            traced = _trace_or_warn(trace_geometry, apply, state, *example_args, **example_kwargs)
        return cls(overrides, hints=hints, strict=strict, traced=traced)

    @classmethod
    def from_linen(cls, module, *args, overrides=None, strict: bool = False, **kwargs) -> GeometryMap:
        """Layouts from a Linen module, traced (shapes only) on ``args``.

        One trace of ``module.init(key, *args, **kwargs)`` as ``jax.jit`` makes it
        (abstract values: no FLOPs): the forward pass inside it decides each parameter
        as in :meth:`from_apply`, walked from the variables that become the parameters;
        the module hints (Dense, DenseGeneral, Conv, Embed, Einsum, norms) recorded
        in the same trace are the cross-check and the fallback. To get the
        variables too, from the same trace, use :func:`init_with_geometry`.

        Args:
          module: the Linen module.
          *args: example inputs.
          overrides: ``{regex: override}``, applied first.
          strict: raise instead of the element-wise fallback for undecided leaves.
          **kwargs: keyword inputs of the module call.
        """
        hints, tr = _linen_init_trace(module, jax.random.key(0), args, kwargs)
        traced = _trace_or_warn(_linen_decisions, module, tr, args, kwargs)
        return cls(overrides, hints=hints, strict=strict, traced=traced)

    def check_overrides(self, paths: Sequence[str], where: str = "geometry") -> None:
        """Raise :class:`GeometryError` if a regex override matches none of ``paths``.

        Called by every named optimizer with the '/'-joined paths of the whole
        parameter tree the first time it sees it (``init``): an override that
        matches nothing is a typo, never silently ignored. ``where`` names the
        option in the message.
        """
        key = tuple(paths)
        if key in self._checked:
            return
        for pattern, _ in self.overrides:
            if not any(pattern.search(p) for p in paths):
                shown = "\n    ".join(paths[:12]) + ("\n    ..." if len(paths) > 12 else "")
                raise GeometryError(
                    f"{where}: the override {pattern.pattern!r} matches no parameter (the regex is "
                    f"re.search-ed on the '/'-joined paths, which are:\n    {shown})\n"
                    "Fix the regex (e.g. anchor it on a path above: r'Dense_1/kernel$') or drop the override."
                )
        self._checked.add(key)

    def with_overrides(self, overrides: Mapping[str, Override]) -> GeometryMap:
        new = GeometryMap(hints=self.hints, strict=self.strict, traced=self.traced)
        new.explicit = dict(self.explicit)
        new.overrides = _compile_overrides(overrides) + self.overrides
        return new

    # -- resolution -----------------------------------------------------------
    def resolve(self, paths: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> tuple[Geometry, ...]:
        """The geometry of each ``(path, shape)``; each leaf is decided once per map.

        A leaf already decided (as part of any earlier tree, typically the
        whole parameter tree that an optimizer's labels see first) keeps its
        geometry when it shows up again, e.g. in the sub-tree that
        ``optax.partition`` hands to one route: the decision is made once, in
        this map, and every transform sharing the map reads it.
        """
        key = (tuple(paths), tuple(tuple(s) for s in shapes))
        if key not in self._cache:
            shape_of = dict(zip(*key))
            out = []
            for p, s in zip(*key):
                g = self._decided.get((p, s))
                if g is None:
                    g = self._decided[(p, s)] = self._decide(p, s, shape_of)
                out.append(g)
            self._cache[key] = tuple(out)
        return self._cache[key]

    def _decide(self, path: str, shape: tuple[int, ...], shape_of) -> Geometry:
        """:meth:`_resolve_one`, with the element-wise fallback unless ``strict``."""
        try:
            g, how = self._resolve_how(path, shape, shape_of)
        except UndecidableGeometryError as e:
            if self.strict:
                raise
            why = getattr(e, "reason", None)
            warnings.warn(
                f"parameter '{path}' with shape {shape}: "
                + (f"the trace could not decide it ({why}), " if why else "no rule decides its geometry, ")
                + "so it gets the element-wise route (AdamW in muon, sign in moga, per-entry normalization in "
                "spectral_sgd, a plain SGD / Adam step in the muP optimizers). "
                + _override_help(path, shape)
                + "\n  Pass geometry=spectral_optax.GeometryMap(strict=True) to make this an error.",
                GeometryWarning,
                stacklevel=2,
            )
            g = Geometry.elementwise(shape, role="output" if _is_output_path(path) else "hidden")
            how = "fallback: element-wise" + (f" (trace: {why})" if why else " (no rule)")
        self._how[(path, shape)] = how
        return g

    def decided_by(self, path: str, shape: Sequence[int]) -> str:
        """How the leaf ``(path, shape)`` was decided: ``'override ...'``, ``'explicit geometry tree'``,
        ``'trace: ...'`` (with what a module hint or name rule said if it differed), ``'module hint'``,
        ``'name rule'`` or ``'fallback: element-wise'`` (the leaf is decided first if it was not yet)."""
        shape = tuple(int(s) for s in shape)
        if (path, shape) not in self._how:
            self.resolve([path], [shape])
        return self._how.get((path, shape), "")

    def _resolve_one(self, path: str, shape: tuple[int, ...], shape_of) -> Geometry:
        return self._resolve_how(path, shape, shape_of)[0]

    def _trace_for(self, path: str, shape: tuple[int, ...]):
        if not self.traced:
            return None
        for p in (path, path[len("params/") :] if path.startswith("params/") else "params/" + path):
            t = self.traced.get(p)
            if t is not None and (t.geometry is None or t.geometry.shape == shape):
                return t
        return None

    def _resolve_how(self, path: str, shape: tuple[int, ...], shape_of) -> tuple[Geometry, str]:
        for pattern, override in self.overrides:
            if pattern.search(path):
                return _apply_override(override, path, shape), f"override {pattern.pattern!r}"
        if path in self.explicit:
            return _apply_override(self.explicit[path], path, shape), "explicit geometry tree"
        t = self._trace_for(path, shape)
        hint = self._from_hint(path, shape)
        if t is not None and t.geometry is not None:
            other, src = hint, "module hint"
            if other is None:
                src = "name rule"
                try:
                    other = self._from_names(path, shape, shape_of)
                except GeometryError:
                    other = None
            how = t.reason
            if other is not None and _axes_of(other) != _axes_of(t.geometry):
                how += f"; {src} said {_short(other)}"
            elif other is not None and other.role != t.geometry.role:
                how += f"; {src} said role {other.role!r}"
            return t.geometry, how
        head = _default_head(path, shape_of)
        if t is None and path.endswith("/kernel") and _GQA_FUSED_NAME.match(path.split("/")[-2]):
            _gqa_fused_warning(path, shape)
        if hint is not None:
            lay = self._hint_for(path)
            if t is None and lay is not None and lay.doubt is not None:
                warnings.warn(
                    f"parameter '{path}' with shape {shape}: taken as {_short(hint)} from its module, but "
                    f"{lay.doubt}. Pass example inputs so that the trace decides "
                    "(spectral_optax.GeometryMap.from_nnx(model, x) / from_linen(model, x)), or fix it with an "
                    "override.\n" + _override_help(path, shape),
                    GeometryWarning,
                    stacklevel=4,
                )
                return hint, "module hint (warned: unchecked without a trace)"
            if head is not None and t is None and hint.role != "output":
                _default_head_warning(path, shape, head)
                return hint.replace(role="output"), f"module hint, guessed read-out ({head})"
            return hint, "module hint" + (f" (trace: {t.reason})" if t is not None else "")
        if t is not None and not t.defer:
            err = UndecidableGeometryError(
                f"the trace cannot decide parameter '{path}' with shape {shape}: {t.reason}.\n"
                + _override_help(path, shape)
            )
            err.reason = t.reason  # type: ignore[attr-defined]
            raise err
        g = self._from_names(path, shape, shape_of)
        if head is not None and g.role == "output" and not _is_output_path(path):
            _default_head_warning(path, shape, head)
            return g, f"name rule, guessed read-out ({head})"
        return g, "name rule" + (f" (trace: {t.reason})" if t is not None else "")

    def _hint_for(self, path: str):
        parts = tuple(path.split("/"))
        module_path, leaf = parts[:-1], parts[-1]
        for mp in (module_path, module_path[1:] if module_path[:1] == ("params",) else None):
            if mp is not None and mp in self.hints and leaf in self.hints[mp]:
                return self.hints[mp][leaf]
        return None

    def _from_hint(self, path, shape) -> Geometry | None:
        lay = self._hint_for(path)
        if lay is None:
            return None
        ndim = len(shape)
        n_batch = ndim - lay.n_in - lay.n_out
        if n_batch < 0:
            return None
        fan_in = tuple(range(n_batch, n_batch + lay.n_in))
        fan_out = tuple(range(n_batch + lay.n_in, ndim))
        if lay.axes is not None:  # an einsum kernel: axes as in its equation (after stacked axes)
            fan_in = tuple(n_batch + a for a in lay.axes[0])
            fan_out = tuple(n_batch + a for a in lay.axes[1])
        role = "output" if _is_output_path(path) else lay.role
        if lay.kind == "vector":
            return Geometry(shape, "vector", (), fan_out, role=role)
        splits = _fused_qkv_splits(path, shape, fan_out) if lay.kind == "matrix" else 1
        return Geometry(shape, lay.kind, fan_in, fan_out, fan_out_splits=splits, role=role)

    def _from_names(self, path: str, shape: tuple[int, ...], shape_of) -> Geometry:
        parts = path.split("/")
        leaf = parts[-1].lower()
        parent = parts[-2] if len(parts) > 1 else ""
        grandparent = parts[-3] if len(parts) > 2 else ""
        ndim = len(shape)
        role = "output" if _is_output_path(path) or _default_head(path, shape_of) else "hidden"

        if "embed" in leaf and ndim >= 2:
            return Geometry.embedding(shape, role=role)
        if leaf in ("bias", "scale") or ndim <= 1:
            sibling = "/".join(parts[:-1] + ["kernel"])
            if leaf == "bias" and sibling in shape_of and sibling != path:
                try:
                    k = self._resolve_one(sibling, shape_of[sibling], shape_of)
                except GeometryError:
                    # The kernel is undecided: its shape still says whether this bias is its
                    # fan-out (a DenseGeneral bias) or stacked copies (nn.scan / nnx.vmap).
                    ks = tuple(shape_of[sibling])
                    trailing = ndim <= len(ks) and ks[len(ks) - ndim :] == shape
                    stacked = ndim >= 2 and len(ks) == ndim + 1 and ks[: ndim - 1] + ks[-1:] == shape
                    if stacked and not trailing:
                        return Geometry(shape, "vector", (), (ndim - 1,), role=role)
                    if ndim >= 2 and not trailing:
                        raise UndecidableGeometryError(
                            f"cannot infer the geometry of parameter '{path}' with shape {shape}: its kernel "
                            f"{ks} is undecided and the shapes do not say which axes are stacked.\n"
                            + _override_help(path, shape)
                        ) from None
                    k = Geometry.vector(shape)
                n_batch = len(k.batch_axes)
                if k.batch_axes == tuple(range(n_batch)) and ndim == n_batch + len(k.fan_out_axes):
                    return Geometry(shape, "vector", (), tuple(range(n_batch, ndim)), role=role)
            # A >= 2-D bias / norm scale without a kernel beside it: stacked
            # copies (nn.scan, nnx.vmap) of a vector over its last axis.
            return Geometry(shape, "vector", (), (ndim - 1,) if ndim else (), role=role)
        g_named = _named_layout(parts, shape, shape_of, role)
        if g_named is not None:
            return g_named
        if leaf == "kernel" and _FUSED_QKV_NAME.match(parent):
            splits = _fused_qkv_splits(path, shape, (ndim - 1,))
            return Geometry(shape, "matrix", (ndim - 2,), (ndim - 1,), fan_out_splits=splits, role=role)
        if ndim == 2:
            return Geometry.matrix(shape, role=role)
        if leaf == "kernel":
            if _CONV_LOCAL_NAME.match(parent):  # one (window x in, out) matrix per output position
                return Geometry(shape, "matrix", (ndim - 2,), (ndim - 1,), role=role)
            if _CONV_NAME.search(parent):
                return Geometry(shape, "matrix", tuple(range(ndim - 1)), (ndim - 1,), role=role)
            if _DENSE_NAME.match(parent):
                return Geometry.matrix(shape, role=role)
            if _QKV_NAME.match(parent):
                return Geometry(shape, "matrix", (ndim - 3,), (ndim - 2, ndim - 1), role=role)
            siblings = ("/".join(parts[:-2] + [n, "kernel"]) for n in ("query", "qkv"))
            if parent.lower() == "out" and ("attention" in grandparent.lower() or any(s in shape_of for s in siblings)):
                return Geometry(shape, "matrix", (ndim - 3, ndim - 2), (ndim - 1,), role=role)
        raise UndecidableGeometryError(
            f"cannot infer the geometry of parameter '{path}' with shape {shape}: no Flax naming "
            f"rule decides which of its {ndim} axes are fan-in, fan-out and batch axes.\n" + _override_help(path, shape)
        )

    # -- user-facing ---------------------------------------------------------
    def tree(self, params) -> Any:
        """A tree of :class:`Geometry` with the structure of ``params``."""
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        paths = [path_str(p) for p, _ in flat]
        geoms = self.resolve(paths, [tuple(np.shape(x)) for _, x in flat])
        return jax.tree_util.tree_unflatten(treedef, list(geoms))

    def leaves(self, tree) -> list[tuple[str, Geometry]]:
        flat = _leaves_with_paths(tree)
        geoms = self.resolve([p for p, _ in flat], [tuple(np.shape(x)) for _, x in flat])
        return [(p, g) for (p, _), g in zip(flat, geoms)]


def _named_layout(parts: list[str], shape: tuple[int, ...], shape_of, role: str) -> Geometry | None:
    """The layouts that public code's parameter names decide without a model (docs/guide.md):
    Hugging Face GPT-2's transposed ``c_attn`` / ``c_fc`` / ``c_proj`` kernels, told from the
    standard layout by ``c_attn``'s (3 d, d) shape, and Gemma's einsum weights. ``None`` if no
    such name; :class:`UndecidableGeometryError` if the name fits but the layout is ambiguous."""
    leaf, parent = parts[-1], parts[-2] if len(parts) > 1 else ""
    ndim = len(shape)
    if leaf == "kernel" and ndim == 2 and _GPT2_CONV1D_NAME.match(parent):
        candidates = ["/".join(parts[:-2] + ["c_attn", "kernel"]), "/".join(parts[:-3] + ["attn", "c_attn", "kernel"])]
        qkv = next((shape_of[c] for c in candidates if c in shape_of and len(shape_of[c]) == 2), None)
        if qkv is None:
            return None
        splits = 3 if parent == "c_attn" else 1
        if qkv[0] == 3 * qkv[1]:  # (3 d, d): the transposed (features, in) layout
            return Geometry(shape, "matrix", (1,), (0,), fan_out_splits=splits, role=role)
        if qkv[1] == 3 * qkv[0]:
            return Geometry(shape, "matrix", (0,), (1,), fan_out_splits=splits, role=role)
        return None
    name = leaf if leaf in _GEMMA_EINSUM or leaf == "gating_einsum" else parent if leaf == "w" else ""
    if name in _GEMMA_EINSUM and ndim >= _GEMMA_MIN_NDIM[name]:
        fan_in, fan_out = _GEMMA_EINSUM[name]
        return Geometry(shape, "matrix", fan_in, fan_out, role=role)
    if name == "gating_einsum" and ndim >= 3:
        # (2, F, H) ('...F,NFH->...NH') or (2, H, F) ('...F,NHF->...NH'): the sibling `linear` (H, F) says which.
        lin = shape_of.get("/".join(parts[:-1] + ["linear"])) if leaf == "gating_einsum" else None
        if lin is not None and len(lin) >= 2 and lin[-2] != lin[-1]:
            if shape[-2:] == (lin[-1], lin[-2]):
                return Geometry(shape, "matrix", (-2,), (-1,), role=role)
            if shape[-2:] == tuple(lin[-2:]):
                return Geometry(shape, "matrix", (-1,), (-2,), role=role)
        raise UndecidableGeometryError(
            f"parameter '{'/'.join(parts)}' with shape {shape}: a Gemma gating einsum is stored (2, F, H) or "
            "(2, H, F) and no sibling 'linear' (H, F) with H != F tells which.\n"
            + _override_help("/".join(parts), shape)
        )
    return None


def _axes_of(g: Geometry) -> tuple:
    return (g.kind, g.fan_in_axes, g.fan_out_axes, g.fan_out_splits)


def _short(g: Geometry) -> str:
    """``matrix in(0,) out(1,) x3`` : a geometry in a few characters, for describe()."""
    if g.kind in ("vector", ELEMENTWISE):
        return g.kind
    split = f" x{g.fan_out_splits}" if g.fan_out_splits > 1 else ""
    return f"{g.kind} in{g.fan_in_axes} out{g.fan_out_axes}{split}"


def _fused_qkv_splits(path: str, shape: tuple[int, ...], fan_out: tuple[int, ...]) -> int:
    """3 for the kernel of a fused QKV projection (``.../qkv/kernel``) whose
    fan-out divides by 3 (query, key and value are separate matrices), else 1."""
    parts = path.split("/")
    if len(parts) < 2 or parts[-1] != "kernel" or not _FUSED_QKV_NAME.match(parts[-2]):
        return 1
    return 3 if int(np.prod([shape[a] for a in fan_out])) % 3 == 0 else 1


def _default_head(path: str, shape_of) -> str | None:
    """The module name (``'Dense_3'``) if ``path`` is a leaf of the guessed read-out of a tree that names
    no head: the highest-numbered top-level ``Dense_N`` with a 2-D kernel, when the tree has other
    layers (another kernel or an embedding) and no module named as a head. ``None`` otherwise."""
    parts = path.split("/")
    if parts[:1] == ["params"]:
        parts = parts[1:]
    if len(parts) != 2 or not _DEFAULT_DENSE_NAME.match(parts[0]):
        return None
    best, others = None, False
    for p, s in shape_of.items():
        q = p.split("/")
        if q[:1] == ["params"]:
            q = q[1:]
        if _is_output_path(p):
            return None
        m = _DEFAULT_DENSE_NAME.match(q[0]) if len(q) == 2 and q[1] == "kernel" and len(s) == 2 else None
        if m is not None:
            others = others or best is not None
            best = int(m.group(1)) if best is None else max(best, int(m.group(1)))
        elif q[-1] == "kernel" or "embed" in q[-1].lower():
            others = True
    if best is None or not others or parts[0] != f"Dense_{best}":
        return None
    return parts[0]


def _default_head_warning(path: str, shape: tuple[int, ...], module: str) -> None:
    kind = "matrix" if path.endswith("kernel") else "vector"
    warnings.warn(
        f"parameter '{path}' with shape {shape}: taken as the read-out (role 'output') because '{module}' is "
        "the highest-numbered top-level Dense_N and no module is named as a head (head, lm_head, logits, "
        "classifier, ...); only the computation says for sure. Pass the model "
        "(spectral_optax.GeometryMap.from_linen(model, x) / from_apply(apply_fn, params, x)), name the layer "
        f"(nn.Dense(..., name='head')), or fix it with an override, e.g. "
        f"geometry={{r'{module}/{path.split('/')[-1]}$': dict(kind='{kind}', role='hidden')}}.",
        GeometryWarning,
        stacklevel=4,
    )


def _gqa_fused_warning(path: str, shape: tuple[int, ...]) -> None:
    warnings.warn(
        f"parameter '{path}' with shape {shape}: a fused '{path.split('/')[-2]}' kernel may hold query, key and "
        "value blocks of different widths (grouped-query attention), which only the forward pass shows; "
        "without it, its fan-out is taken as 3 equal blocks when it divides by 3, else as one matrix. Pass the "
        "model (spectral_optax.GeometryMap.from_linen(model, x) / from_nnx(model, x) / from_apply(apply_fn, "
        "params, x)), or fix it with an override, e.g. "
        f"geometry={{r'{path.split('/')[-2]}/kernel$': dict(kind='matrix', fan_out_splits=1)}} (one matrix).",
        GeometryWarning,
        stacklevel=4,
    )


def _is_output_path(path: str) -> bool:
    return any(_OUTPUT_NAME.match(part) for part in path.split("/")[:-1])


GeometryLike = Any  # None | GeometryMap | Mapping[str, Override] | tree of Geometry | nnx.Module


def as_geometry_map(geometry: GeometryLike = None) -> GeometryMap:
    """Normalise every accepted ``geometry=`` argument into a :class:`GeometryMap`.

    Accepts ``None`` (infer from names), a :class:`GeometryMap`, a dict
    ``{regex: override}``, a tree whose leaves are :class:`Geometry` (matched
    by path), or a live ``flax.nnx.Module``. Leaves that no rule decides fall
    back to ``'elementwise'`` with a warning; use ``GeometryMap(..., strict=True)``
    to raise instead.

    Args:
      geometry: any of the forms above.

    Returns:
      A :class:`GeometryMap` (the argument itself when it is one).
    """
    if geometry is None:
        return GeometryMap()
    if isinstance(geometry, GeometryMap):
        return geometry
    try:
        from flax import nnx

        if isinstance(geometry, nnx.Module):
            return GeometryMap.from_nnx(geometry)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(geometry, Mapping) and _looks_like_regex_dict(geometry):
        return GeometryMap(geometry)
    return GeometryMap(tree=geometry)


def init_with_geometry(module, rngs, *args, overrides=None, strict: bool = False, **kwargs):
    """``module.init(rngs, *args, **kwargs)`` and its :class:`GeometryMap`, from one trace.

    ``jax.jit(module.init).trace(...)`` records the forward pass fed by the
    variables that become the parameters: the geometry is read off that jaxpr as
    in :meth:`GeometryMap.from_linen`, and the same trace is lowered, compiled
    and run for the variables, so the model is traced once for both (the
    geometry costs the walk and the recorded module hints; docs/guide.md has the
    measurement). The variables are those of ``jax.jit(module.init)(rngs, *args, **kwargs)``.

    Args:
      module: a Linen module.
      rngs: the PRNG key, or a dict of keys, as for ``module.init``.
      *args: the example inputs of ``module.init``.
      overrides: ``{regex: override}``, applied first.
      strict: raise instead of the element-wise fallback for undecided leaves.
      **kwargs: keyword inputs of the module call.

    Returns:
      ``(variables, geometry)``: the variables dict (``{'params': ..., ...}``)
      and the :class:`GeometryMap` to pass as ``geometry=``.
    """
    hints, tr = _linen_init_trace(module, rngs, args, kwargs)
    traced = _trace_or_warn(_linen_decisions, module, tr, args, kwargs)
    params, rest = tr.values()
    return {"params": params, **rest}, GeometryMap(overrides, hints=hints, strict=strict, traced=traced)


def _looks_like_regex_dict(d: Mapping) -> bool:
    """A regex dict maps patterns straight to overrides; an explicit geometry
    tree is nested like the params it describes."""

    def is_override(v):
        if isinstance(v, (Geometry, str)) or callable(v):
            return True
        return isinstance(v, Mapping) and bool(set(v) & {"kind", "fan_in_axes", "fan_out_axes"})

    return all(isinstance(k, str) for k in d) and all(is_override(v) for v in d.values())


def infer_geometry(params, geometry: GeometryLike = None) -> Any:
    """The geometry tree of ``params`` (same structure, :class:`Geometry` leaves).

    Args:
      params: a Linen param dict, an ``nnx.State`` or any pytree of arrays.
      geometry: overrides; see :func:`as_geometry_map`.
    """
    return as_geometry_map(geometry).tree(params)


def map_with_geometry(
    fn: Callable,
    geometry: GeometryLike,
    tree,
    *rest,
    num_outputs: int = 1,
    with_path: bool = False,
    skip_empty: bool = False,
):
    """``tree_map`` over ``tree`` (and same-structure ``rest``) calling
    ``fn(geometry, leaf, *rest_leaves)`` with each leaf's :class:`Geometry`.

    ``None`` leaves (and optax ``MaskedNode``s) pass through untouched. With
    ``num_outputs=n > 1``, ``fn`` returns an n-tuple and a tuple of n trees is
    returned (non-array leaves are copied into each). With ``with_path=True``
    ``fn(path, geometry, leaf, *rest_leaves)`` also gets the '/'-joined path.
    With ``skip_empty=True``, size-0 array leaves of ``tree`` are not handed
    to ``fn`` either: they pass through as they are (an empty update has no
    direction to normalize; the dual transforms use this).

    Args:
      fn: ``fn(geometry, leaf, *rest_leaves)`` (``fn(path, geometry, leaf,
        *rest_leaves)`` with ``with_path=True``).
      geometry: geometry overrides, see :func:`as_geometry_map`.
      tree: the tree whose leaves' geometries are resolved.
      rest: further trees of the same structure, passed leaf by leaf.
      num_outputs: the number of outputs of ``fn`` (trees returned).
      with_path: also pass each leaf's '/'-joined path.
      skip_empty: pass size-0 leaves through without calling ``fn``.
    """
    gmap = as_geometry_map(geometry)
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    rest_flat = [treedef.flatten_up_to(r) for r in rest]  # type: ignore[attr-defined]
    paths = [path_str(p) for p, _ in flat]
    shapes = [tuple(np.shape(x)) for _, x in flat]
    is_array = [hasattr(x, "shape") and not (skip_empty and math.prod(s) == 0) for (_, x), s in zip(flat, shapes)]
    geoms = gmap.resolve([p for p, a in zip(paths, is_array) if a], [s for s, a in zip(shapes, is_array) if a])
    it = iter(geoms)
    out = []
    for i, (_, x) in enumerate(flat):
        if is_array[i]:
            args = (paths[i],) if with_path else ()
            y = fn(*args, next(it), x, *(r[i] for r in rest_flat))
        else:
            y = (x,) * num_outputs if num_outputs > 1 else x
        out.append(y)
    if num_outputs == 1:
        return jax.tree_util.tree_unflatten(treedef, out)
    return tuple(jax.tree_util.tree_unflatten(treedef, [y[k] for y in out]) for k in range(num_outputs))


def label_by_geometry(label_fn: Callable[[str, Geometry], Any], geometry: GeometryLike = None) -> Callable[[Any], Any]:
    """A ``param_labels`` callable for ``optax.partition`` driven by geometry.

    Args:
      label_fn: ``(path, geometry) -> label`` for every array leaf.
      geometry: overrides; see :func:`as_geometry_map`.

    Returns:
      ``params -> tree of labels`` with the structure of ``params``.
    """
    gmap = as_geometry_map(geometry)

    def labels(params):
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        paths = [path_str(p) for p, _ in flat]
        geoms = gmap.resolve(paths, [tuple(np.shape(x)) for _, x in flat])
        return jax.tree_util.tree_unflatten(treedef, [label_fn(p, g) for p, g in zip(paths, geoms)])

    return labels


def label_by_path(label_fn: Callable[[str], Any], default: Any = False) -> Callable[[Any], Any]:
    """``params -> tree`` with ``label_fn(path)`` at every array leaf (``default`` elsewhere).

    For rules that depend on the '/'-joined path only (regex masks), so that
    no geometry needs to be decided.
    """

    def labels(params):
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        return jax.tree_util.tree_unflatten(
            treedef, [label_fn(path_str(p)) if hasattr(x, "shape") else default for p, x in flat]
        )

    return labels
