"""Views of a parameter: how ops that only move axes carry a parameter's axes.

A value derived from parameter ``p`` by reshapes, transposes, broadcasts,
slices and gathers of whole slices is a *view* of ``p``: for each of its
dimensions, the pieces of ``p``'s axes it carries (:data:`_Dims`). The
functions here compute the view an op's output is (``None`` where the op does
not keep one); :mod:`spectral_optax._geometry.walk` applies them while it
walks a jaxpr, and records the uses (:class:`_Use`) that
:mod:`spectral_optax._geometry.trace` turns into decisions.
"""

from __future__ import annotations

import dataclasses

# A piece of a parameter axis carried by one dimension of a derived value:
# (parameter axis, number of coarser blocks before it, size). (-1, 1, size) is
# a dimension not from the parameter (broadcast, or an activation dimension);
# (-2, 1, size) a product output's dimension from a dot_general batch dimension.
_Piece = tuple[int, int, int]
_Dims = tuple[tuple[_Piece, ...], ...]

_STRUCTURAL_UNARY = {"convert_element_type", "copy", "copy_p", "reduce_precision", "optimization_barrier"}
_ELEMENTWISE = {
    "add", "sub", "mul", "div", "max", "min", "pow", "neg", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "abs", "sign", "sqrt", "rsqrt", "cbrt", "square", "integer_pow", "erf", "erfc", "erf_inv", "sin",
    "cos", "tan", "atan2", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "select_n", "clamp",
    "rem", "floor", "ceil", "round", "is_finite", "ne", "eq", "lt", "gt", "le", "ge", "and", "or", "not", "xor",
    "nextafter", "stop_gradient", "real", "imag", "conj", "add_any", "complex",
}  # fmt: skip
# Ops whose output puts the blocks of a cut back side by side (a rotary embedding's halves or pairs):
# blocks of one cut meeting here were not used separately.
_REJOIN = {"concatenate", "stack", "complex"}
_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "reduce_and", "reduce_or"}


@dataclasses.dataclass
class _View:
    p: int
    dims: _Dims
    extra: tuple = ()  # records attached to every use: (cls, axis) / ("block", axis, n)


@dataclasses.dataclass
class _ProdOut:
    use: int
    dims: _Dims
    tags: frozenset = frozenset()  # (cut, block): the cuts of the product this value is one block of


@dataclasses.dataclass
class _Cut:
    """A product's output cut into blocks (pending until the walk ends: void if the blocks are re-joined)."""

    use: int
    records: list
    note: str = ""  # an unequal / strided cut: why its blocks cannot be expressed
    rejoined: bool = False


@dataclasses.dataclass
class _Use:
    p: int
    kind: str  # 'dot', 'conv', 'gather', 'elementwise', 'opaque'
    records: list
    out: int | None = None
    note: str = ""
    partner: int | None = None  # an element-wise use on a product's output: that product's use


def _sub_jaxpr(eqn):
    """The one sub-jaxpr of a call-like equation (jit, custom_jvp / custom_vjp, remat), matched 1:1."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(key)
        if j is None:
            continue
        jaxpr = getattr(j, "jaxpr", j)
        if not hasattr(jaxpr, "eqns"):
            continue
        if len(jaxpr.invars) == len(eqn.invars) and len(jaxpr.outvars) == len(eqn.outvars):
            return jaxpr, getattr(j, "consts", ())
    return None


def _has_jaxpr(v) -> bool:
    if isinstance(v, (tuple, list)):
        return any(_has_jaxpr(x) for x in v)
    return hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")


def _take(pieces: list[_Piece], size: int) -> tuple[_Piece, ...] | None:
    """Consume pieces (in place) to make one dimension of ``size``."""
    out: list[_Piece] = []
    need = size
    while need > 1:
        if not pieces:
            return None
        a, o, s = pieces.pop(0)
        if s == 1:
            continue
        if s <= need:
            if need % s:
                return None
            out.append((a, o, s))
            need //= s
        else:
            if s % need:
                return None
            out.append((a, o, need))
            pieces.insert(0, (a, o * need, s // need))
            need = 1
    return tuple(out) if out else ((-1, 1, 1),)


def _move_dims(name, p, dims: _Dims, in_shape, out_shape) -> _Dims | None:
    """The pieces carried by each output dimension of a reshape / squeeze / expand_dims / broadcast / tile
    (a tile only of size-1 dimensions)."""
    if name == "tile":
        reps = tuple(p["reps"])
        if any(r != 1 and s != 1 for r, s in zip(reps, in_shape)) or len(reps) != len(in_shape):
            return None
        return tuple(dims[d] if r == 1 else ((-1, 1, int(out_shape[d])),) for d, r in enumerate(reps))
    if name == "broadcast_in_dim":
        bd = p["broadcast_dimensions"]
        out: list[tuple[_Piece, ...]] = [((-1, 1, int(s)),) for s in out_shape]
        for i, d in enumerate(bd):
            if in_shape[i] == out_shape[d]:
                out[d] = dims[i]
            elif in_shape[i] != 1:
                return None
        return tuple(out)
    if name == "reshape" and p.get("dimensions") is not None:
        return None
    # reshape, squeeze and expand_dims: regroup the pieces in order.
    pieces = [pc for d in range(len(in_shape)) for pc in dims[d] if in_shape[d] != 1]
    out2: list[tuple[_Piece, ...]] = []
    for s in out_shape:
        t = _take(pieces, int(s))
        if t is None:
            return None
        out2.append(t)
    if any(pc[2] != 1 for pc in pieces):
        return None
    return tuple(out2)


def _cut(name, p, dims: _Dims, in_shape, out_shapes) -> tuple[list, list[_Dims]] | None:
    """Records and output dims of a slice / dynamic_slice / split in equal aligned blocks."""
    out_shape = out_shapes[0]
    if name == "split":
        if len(set(p["sizes"])) != 1:
            return None
        cut = [p["axis"]]
    else:
        if name == "slice" and p.get("strides") and any(s != 1 for s in p["strides"]):
            return None
        cut = [d for d in range(len(in_shape)) if out_shape[d] != in_shape[d]]
        starts = p.get("start_indices") if name == "slice" else None
        if starts is not None and any(starts[d] % out_shape[d] for d in cut):
            return None
    recs = []
    new = list(dims)
    for d in cut:
        k = in_shape[d] // out_shape[d]
        if in_shape[d] % out_shape[d]:
            return None
        pcs = [pc for pc in dims[d] if pc[2] != 1]
        if not pcs:
            continue
        a, o, s = pcs[0]
        if s % k:
            return None
        if a >= 0:
            recs.append(("block", a, o * k))
        rest = ((a, o * k, s // k),) if s // k > 1 else ()
        new[d] = rest + tuple(pcs[1:]) or ((-1, 1, 1),)
    return recs, [tuple(new)] * len(out_shapes)


def _gathered_dims(dn, sizes, shape, dims: _Dims, out_shape) -> _Dims | None:
    """The pieces carried by each output dimension of a gather that picks whole slices of the parameter by
    index (every indexed axis sliced to size 1, every other axis whole); ``None`` for any other gather."""
    if dn.operand_batching_dims or any(
        (sizes[d] != 1) if d in dn.start_index_map else (sizes[d] != shape[d]) for d in range(len(shape))
    ):
        return None
    kept = [d for d in range(len(shape)) if d not in dn.collapsed_slice_dims]
    out: list[tuple[_Piece, ...]] = [((-1, 1, int(s)),) for s in out_shape]
    for od, d in zip(dn.offset_dims, kept):
        out[od] = dims[d] if sizes[d] == shape[d] else ((-1, 1, 1),)
    return tuple(out)


def _param_view(k: int, shape: tuple[int, ...]) -> _View:
    """Parameter ``k`` itself: dimension ``a`` carries all of axis ``a``."""
    return _View(k, tuple(((a, 1, s),) for a, s in enumerate(shape)))
