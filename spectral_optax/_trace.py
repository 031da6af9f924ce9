"""Geometry read off the computation: trace a forward pass, follow each parameter.

``trace_geometry(apply_fn, params, *args)`` runs ``jax.make_jaxpr`` on
abstract inputs (``jax.ShapeDtypeStruct``: shapes only, no FLOPs) and follows
every parameter's variable through the ops that only move its axes around
(``transpose``, ``reshape``, ``slice`` / ``split`` / indexing, dtype casts,
scaling by a constant, the sub-jaxprs of ``jit`` / ``custom_jvp`` /
``custom_vjp`` / ``remat`` / ``cond`` / ``scan``) to the ops that consume it:

* ``dot_general``: dimensions contracted with the activation are fan-in,
  ``dot_general`` batch dimensions are batch axes, the other dimensions fan-out;
* ``conv_general_dilated`` (kernel operand): window x input features fan-in,
  output features fan-out;
* ``gather`` (a table indexed by the input): an embedding, indexed axes fan-in;
* an element-wise op with an activation (a bias, a norm scale): a vector;
* a ``scan`` over stacked parameters: the stacked axis is a batch axis;
* an axis cut into equal blocks that are used separately (a fused QKV kernel
  split before the product, or its product split after it, forward-followed
  to the ``split`` / ``slice``): a batch axis when every block is one index,
  else ``fan_out_splits`` blocks.

The read-out (``role='output'``) is a parametrized product whose result
reaches the traced function's output without passing through another
parametrized product. A table used both as lookup and as product (a tied
embedding) is an embedding; read out, it gets ``role='output'``.

Anything else (an opaque primitive or callback, uses that disagree, an axis
cut in blocks that a :class:`Geometry` cannot express) leaves the parameter
undecided with the reason, and :class:`~spectral_optax.GeometryMap` handles it
(module hint, else the element-wise fallback with a ``GeometryWarning``).
``trace_init(init_fn, rngs, *args)`` does the same from one trace of an
``init`` that runs the forward pass (Linen's ``init``, as ``jax.jit`` traces
it): the walk starts from the variables that become the parameters (seeded
where they are made, inside ``scan`` / ``jit`` bodies too), the read-out is
judged at the values the init computes and drops (the model's output), and
the same trace is compiled for the values, so that init and geometry cost one
trace of the model.

A parameter used only element-wise over two or more axes (a learned position
table added to the activations, a 2-D bias) is deferred to the hints and name
rules, since element-wise use alone does not say whether it is a table or a
vector. docs/guide.md lists the rules and their order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from spectral_optax._geometry import Geometry, path_str

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
    "nextafter", "stop_gradient", "real", "imag", "conj", "add_any",
}  # fmt: skip
_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "reduce_and", "reduce_or"}


@dataclasses.dataclass
class TraceDecision:
    """What the trace says about one parameter.

    Attributes:
      geometry: the decided geometry, or ``None``.
      reason: how it was decided, or why not.
      defer: ``True`` when the trace saw nothing against the name rules and
        hints (unused, or element-wise over several axes): they decide, silently.
    """

    geometry: Geometry | None
    reason: str
    defer: bool = False


@dataclasses.dataclass
class _View:
    p: int
    dims: _Dims
    extra: tuple = ()  # records attached to every use: (cls, axis) / ("block", axis, n)


@dataclasses.dataclass
class _ProdOut:
    use: int
    dims: _Dims


@dataclasses.dataclass
class _Use:
    p: int
    kind: str  # 'dot', 'conv', 'gather', 'elementwise', 'opaque'
    records: list
    out: int | None = None
    note: str = ""
    partner: int | None = None  # an element-wise use on a product's output: that product's use


class _Tracer:
    def __init__(self, shapes: Sequence[tuple[int, ...]]):
        self.shapes = [tuple(s) for s in shapes]
        self.views: dict[int, _View] = {}
        self.prods: dict[int, _ProdOut] = {}
        self.act: set[int] = set()
        self.uses: list[_Use] = []
        self.nodes: list[tuple[list[int], list[int], bool]] = []
        self.unmapped: set[int] = set()  # parameters made (in an init trace) where the walk cannot seed them
        self._n = 0

    def fresh(self) -> int:
        self._n += 1
        return self._n

    # ---- records ---------------------------------------------------------
    def use(self, view: _View, kind: str, records=(), out=None, note="") -> int:
        self.uses.append(_Use(view.p, kind, list(view.extra) + list(records), out, note))
        return len(self.uses) - 1

    def classify(self, view: _View, dim_classes: dict[int, str]) -> list:
        recs: list[tuple] = []
        for d, cls in dim_classes.items():
            for a, outer, size in view.dims[d]:
                if a < 0:
                    continue
                if outer == 1 and size < self.shapes[view.p][a] and cls == "batch":
                    recs.append(("block", a, size))
                else:
                    recs.append((cls, a))
        return recs

    # ---- the walk --------------------------------------------------------
    def seed(self, view: _View) -> int:
        """A fresh value that is the parameter ``view`` (where an init trace makes it)."""
        val = self.fresh()
        self.views[val] = view
        return val

    def walk(self, jaxpr, in_vals: Sequence[int | None], seeds: dict | None = None, env_out: dict | None = None):
        """Walk ``jaxpr``; ``seeds`` maps the variables that are parameters (an init trace) to their views;
        ``env_out`` (if given) receives every variable's value."""
        env: dict[Any, int | None] = {} if env_out is None else env_out
        seeds = seeds or {}
        for v, val in zip(jaxpr.invars, in_vals):
            env[v] = self.seed(seeds[v]) if v in seeds else val
        for v in getattr(jaxpr, "constvars", ()):
            env[v] = self.seed(seeds[v]) if v in seeds else self.fresh()

        def read(x):
            if isinstance(x, jex_core.Literal):
                return None
            return env.get(x)

        for eqn in jaxpr.eqns:
            ins = [read(x) for x in eqn.invars]
            mine = {i: seeds[o] for i, o in enumerate(eqn.outvars) if o in seeds} if seeds else {}
            outs = self.eqn(eqn, ins, mine)
            for i, (v, val) in enumerate(zip(eqn.outvars, outs)):
                env[v] = self.seed(mine[i]) if i in mine else val
        return [read(x) for x in jaxpr.outvars]

    def eqn(self, eqn, ins: list[int | None], seeds: dict[int, _View] | None = None) -> list[Any]:
        if not seeds and not any(v is not None and (v in self.act or v in self.views) for v in ins):
            return [self.fresh() for _ in eqn.outvars]  # no parameter, no activation (an init's random draws)
        name = eqn.primitive.name
        p = eqn.params
        seeds = seeds or {}
        if name == "scan":
            return self.scan(eqn, ins, seeds)
        if name in ("while", "cond") and seeds:
            self.unmapped.update(v.p for v in seeds.values())  # a parameter made inside a loop / branch
        if name == "while":
            return self.while_loop(eqn, ins)
        if name == "cond":
            return self.cond(eqn, ins)
        sub = _sub_jaxpr(eqn)
        if sub is not None:
            jaxpr, _ = sub
            sub_seeds = self.inner_seeds(jaxpr.outvars, seeds, lambda v: v)
            sub_outs = self.walk(jaxpr, ins, sub_seeds)
            return [o if o is not None else self.fresh() for o in sub_outs]
        if seeds and any(_has_jaxpr(v) for v in p.values()):
            self.unmapped.update(v.p for v in seeds.values())  # made inside a sub-computation not followed

        outs = [self.fresh() for _ in eqn.outvars]
        views = [self.views.get(v) if v is not None else None for v in ins]
        is_act = any(v in self.act for v in ins if v is not None)
        if is_act:
            self.act.update(outs)
        blocking = False
        has_view = any(views)
        if has_view or any(v in self.prods for v in ins if v is not None):
            in_shapes = [tuple(getattr(x.aval, "shape", ())) for x in eqn.invars]
            out_shape = tuple(getattr(eqn.outvars[0].aval, "shape", ())) if eqn.outvars else ()
            if has_view:
                blocking = self.consume(eqn, name, p, ins, views, outs, in_shapes, out_shape)
            if not has_view or name in _ELEMENTWISE:
                self.follow_product(eqn, name, p, ins, outs, in_shapes, out_shape)
        self.nodes.append(([v for v in ins if v is not None], outs, blocking))
        return list(outs)

    # ---- parameters (views) ----------------------------------------------
    def consume(self, eqn, name, p, ins, views, outs, in_shapes, out_shape) -> bool:
        """Handle an equation with a parameter-derived operand; True if it is a parametrized product."""
        vi = next(i for i, v in enumerate(views) if v is not None)
        view = views[vi]
        assert view is not None
        if name in _STRUCTURAL_UNARY or name == "rev":
            self.views[outs[0]] = view
            return False
        if name == "transpose":
            perm = p["permutation"]
            self.views[outs[0]] = dataclasses.replace(view, dims=tuple(view.dims[i] for i in perm))
            return False
        if name in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim"):
            dims = _move_dims(name, p, view.dims, in_shapes[vi], out_shape)
            if dims is None:
                self.use(view, "opaque", note=f"{name} {in_shapes[vi]} -> {out_shape}")
            else:
                self.views[outs[0]] = dataclasses.replace(view, dims=dims)
            return False
        if name in ("slice", "dynamic_slice", "split"):
            res = _cut(name, p, view.dims, in_shapes[vi], [tuple(o.aval.shape) for o in eqn.outvars])
            if res is None or vi != 0:
                self.use(view, "opaque", note=f"{name} of the parameter in unequal or strided pieces")
                return False
            recs, dims_list = res
            for o, dims in zip(outs, dims_list):
                self.views[o] = _View(view.p, dims, view.extra + tuple(recs))
            return False
        if name == "dot_general":
            other = ins[1 - vi]
            if views[1 - vi] is not None or other not in self.act:
                self.use(view, "opaque", note="dot_general of the parameter with another parameter or a constant")
                return False
            (lc, rc), (lb, rb) = p["dimension_numbers"]
            contract, batch = (lc, lb) if vi == 0 else (rc, rb)
            nd = len(view.dims)
            classes = {d: "in" for d in contract} | {d: "batch" for d in batch}
            classes |= {d: "out" for d in range(nd) if d not in classes}
            u = self.use(view, "dot", self.classify(view, classes), out=outs[0])
            # Product output: (batch, lhs free, rhs free); follow the parameter's free dims.
            other_free = [d for d in range(len(in_shapes[1 - vi])) if d not in (rc if vi == 0 else lc)]
            other_free = [d for d in other_free if d not in (rb if vi == 0 else lb)]
            free = [d for d in range(nd) if d not in contract and d not in batch]
            act_dims = tuple(((-1, 1, in_shapes[1 - vi][d]),) for d in other_free)
            mine = tuple(view.dims[d] for d in free)
            bdims = tuple(((-2, 1, in_shapes[vi][d]),) for d in batch)  # -2: a dot_general batch dim
            self.prods[outs[0]] = _ProdOut(u, bdims + (mine + act_dims if vi == 0 else act_dims + mine))
            return True
        if name == "conv_general_dilated":
            if vi != 1 or ins[0] not in self.act or p.get("batch_group_count", 1) != 1:
                self.use(view, "opaque", note="conv_general_dilated with the parameter as input")
                return False
            rhs = p["dimension_numbers"].rhs_spec
            classes = {rhs[0]: "out"} | {d: "in" for d in rhs[1:]}
            self.use(view, "conv", self.classify(view, classes), out=outs[0])
            return True
        if name == "gather":
            if vi != 0:
                self.use(view, "opaque", note="the parameter used as gather indices")
                return False
            dn = p["dimension_numbers"]
            sizes = p["slice_sizes"]
            shape = in_shapes[0]
            classes = {}
            for d in range(len(shape)):
                if d in dn.operand_batching_dims:
                    classes[d] = "batch"
                elif d in dn.start_index_map and sizes[d] < shape[d]:
                    classes[d] = "in"
                elif sizes[d] == shape[d]:
                    classes[d] = "out"
                else:
                    self.use(view, "opaque", note="gather of partial slices")
                    return False
            self.use(view, "gather", self.classify(view, classes))
            return False
        if name in _ELEMENTWISE:
            others = [v for i, v in enumerate(ins) if i != vi and v is not None]
            if any(v in self.act for v in others):
                every = {d: "out" for d in range(len(view.dims))}
                partner = next((self.prods[v] for v in others if v in self.prods), None)
                if partner is not None and len(partner.dims) == len(view.dims):
                    # A bias on a product's output: its axes over the product's batch dims (ConvLocal's
                    # positions, per-expert outputs) are batch axes too.
                    every = {d: "batch" if any(pc[0] == -2 for pc in partner.dims[d]) else "out" for d in every}
                u = self.use(view, "elementwise", self.classify(view, every))
                self.uses[u].partner = partner.use if partner is not None else None
            elif tuple(out_shape) == tuple(in_shapes[vi]):
                self.views[outs[0]] = view  # scaled by a constant / by itself: still the parameter
            return False
        if name in _REDUCTIONS:
            return False  # a norm of the parameter (weight normalization): not a use
        self.use(view, "opaque", note=f"consumed by {name!r}")
        return False

    # ---- product outputs, followed forward to a split ----------------------
    def follow_product(self, eqn, name, p, ins, outs, in_shapes, out_shape) -> None:
        prods = [(i, self.prods[v]) for i, v in enumerate(ins) if v is not None and v in self.prods]
        if not prods:
            return
        i, po = prods[0]
        if name in _STRUCTURAL_UNARY or name == "rev":
            self.prods[outs[0]] = po
        elif name == "transpose":
            self.prods[outs[0]] = _ProdOut(po.use, tuple(po.dims[d] for d in p["permutation"]))
        elif name in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim"):
            dims = _move_dims(name, p, po.dims, in_shapes[i], out_shape)
            if dims is not None:
                self.prods[outs[0]] = _ProdOut(po.use, dims)
        elif name in ("slice", "dynamic_slice", "split") and i == 0:
            res = _cut(name, p, po.dims, in_shapes[i], [tuple(o.aval.shape) for o in eqn.outvars])
            if res is None:
                self.uses[po.use].records.append(("undecided", -1))
                sizes = f" of sizes {tuple(int(n) for n in p['sizes'])}" if name == "split" else ""
                self.uses[po.use].note = (
                    f"its product is cut ({name}) into unequal or strided blocks{sizes} (a fused projection of "
                    "different widths, e.g. grouped-query q / k / v): a Geometry splits a fan-out only into "
                    "equal blocks. Override it as one matrix, or keep the blocks as separate parameters"
                )
                return
            recs, dims_list = res
            self.uses[po.use].records.extend(recs)
            for o, dims in zip(outs, dims_list):
                self.prods[o] = _ProdOut(po.use, dims)
        elif name in _ELEMENTWISE and len(prods) == 1 and tuple(out_shape) == tuple(in_shapes[i]):
            self.prods[outs[0]] = po

    def inner_seeds(self, outvars, seeds: dict[int, _View], inner: Callable[[_View], _View]) -> dict:
        """Seeds of a sub-jaxpr: its outvar ``i`` is the parameter the equation's output ``i`` is."""
        out = {}
        for i, view in seeds.items():
            v = outvars[i]
            if isinstance(v, jex_core.Literal):
                self.unmapped.add(view.p)
            else:
                out[v] = inner(view)
        return out

    def unstack(self, view: _View) -> _View:
        """One slice of a parameter stacked on its leading axis (a scan's xs or ys): that axis is batch."""
        stacked = [("batch", a) if (o == 1 and s == self.shapes[view.p][a]) else ("undecided", a)
                   for a, o, s in view.dims[0] if a >= 0]  # fmt: skip
        return _View(view.p, view.dims[1:], view.extra + tuple(stacked))

    # ---- control flow ------------------------------------------------------
    def scan(self, eqn, ins, seeds: dict[int, _View]):
        p = eqn.params
        closed = p["jaxpr"]
        nc, ncar = p["num_consts"], p["num_carry"]
        self.unmapped.update(v.p for i, v in seeds.items() if i < ncar)  # a parameter carried: not followed
        body_seeds = self.inner_seeds(closed.jaxpr.outvars, {i: v for i, v in seeds.items() if i >= ncar}, self.unstack)
        consts, carry, xs = ins[:nc], ins[nc : nc + ncar], ins[nc + ncar :]
        carry_in = [self.fresh() for _ in carry]
        for c, ci in zip(carry, carry_in):
            if c is not None:
                self.nodes.append(([c], [ci], False))
                if c in self.act:
                    self.act.add(ci)
        x_in = []
        for x in xs:
            xi = self.fresh()
            x_in.append(xi)
            if x is None:
                continue
            self.nodes.append(([x], [xi], False))
            if x in self.act:
                self.act.add(xi)
            view = self.views.get(x)
            if view is not None:
                self.views[xi] = self.unstack(view)
        outs = self.walk(closed.jaxpr, list(consts) + carry_in + x_in, body_seeds)
        body_carry, body_ys = outs[:ncar], outs[ncar:]
        for bc, ci in zip(body_carry, carry_in):
            if bc is not None:
                self.nodes.append(([bc], [ci], False))
        result = []
        for bc in body_carry:
            result.append(bc if bc is not None else self.fresh())
        for y in body_ys:
            yo = self.fresh()
            if y is not None:
                self.nodes.append(([y], [yo], False))
                if y in self.act:
                    self.act.add(yo)
            result.append(yo)
        if any(ci in self.act for ci in carry_in) or any(x in self.act for x in xs if x is not None):
            self.act.update(r for r in result if r is not None)
        return result

    def while_loop(self, eqn, ins):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        bconsts, carry = ins[cn : cn + bn], ins[cn + bn :]
        carry_in = [self.fresh() for _ in carry]
        for c, ci in zip(carry, carry_in):
            if c is not None:
                self.nodes.append(([c], [ci], False))
        self.act.update(ci for c, ci in zip(carry, carry_in) if c in self.act)
        outs = self.walk(p["body_jaxpr"].jaxpr, list(bconsts) + carry_in)
        for bc, ci in zip(outs, carry_in):
            if bc is not None:
                self.nodes.append(([bc], [ci], False))
        result = [o if o is not None else self.fresh() for o in outs]
        if any(c in self.act for c in carry):
            self.act.update(result)
        return result

    def cond(self, eqn, ins):
        ops = ins[1:]
        result = [self.fresh() for _ in eqn.outvars]
        branch_outs = [self.walk(br.jaxpr, ops) for br in eqn.params["branches"]]
        for k, r in enumerate(result):
            srcs = [bo[k] for bo in branch_outs if bo[k] is not None]
            self.nodes.append((srcs, [r], False))
            if any(s in self.act for s in srcs):
                self.act.add(r)
        return result

    # ---- the read-out ------------------------------------------------------
    def clean(self, outvals: Sequence[int | None]) -> set[int]:
        """Values from which the output is reached without a parametrized product."""
        clean = {v for v in outvals if v is not None}
        changed = True
        while changed:
            changed = False
            for ins, outs, blocking in reversed(self.nodes):
                if blocking or not any(o in clean for o in outs):
                    continue
                for v in ins:
                    if v not in clean:
                        clean.add(v)
                        changed = True
        return clean


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


def _pieces(dims: _Dims, group: Sequence[int]) -> list[_Piece]:
    return [pc for d in group for pc in dims[d]]


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
    """The pieces carried by each output dimension of a reshape / squeeze / expand_dims / broadcast."""
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


# --------------------------------------------------------------------------
# Decisions.
# --------------------------------------------------------------------------
def _axis_classes(shape, records) -> tuple[dict[int, str], dict[int, int]] | str:
    """Per parameter axis: 'in' / 'out' / 'batch', and block counts; or the reason it is undecided."""
    by_axis: dict[int, set] = {a: set() for a in range(len(shape))}
    blocks: dict[int, set] = {a: set() for a in range(len(shape))}
    for r in records:
        if r[0] == "undecided":
            return "its blocks cannot be expressed as a Geometry"
        if r[0] == "block":
            blocks[r[1]].add(r[2])
        else:
            by_axis[r[1]].add(r[0])
    classes, splits = {}, {}
    for a in range(len(shape)):
        cls, bl = by_axis[a], blocks[a]
        if shape[a] in bl:
            cls, bl = {"batch"}, bl - {shape[a]}
            if bl:
                return f"axis {a} is cut into blocks of different sizes"
        if not cls:
            if shape[a] == 1:
                cls = {"batch"}
            else:
                return f"axis {a} never reaches a product"
        if len(cls) > 1:
            return f"axis {a} is used as {' and '.join(sorted(cls))} by different ops"
        (c,) = cls
        if len(bl) > 1 or (bl and c == "in"):
            return f"axis {a} ({c}) is cut into blocks {sorted(bl)} that a Geometry cannot express"
        classes[a] = c
        if bl:
            splits[a] = bl.pop()
    return classes, splits


def _decide(shape, uses: list[_Use], clean: set[int], all_uses: list[_Use]) -> TraceDecision:
    shape = tuple(shape)
    if not uses:
        return TraceDecision(None, "unused in the traced call", defer=True)
    opaque = [u for u in uses if u.kind == "opaque"]
    if opaque:
        return TraceDecision(None, f"used in a way the trace does not follow: {opaque[0].note}")
    gathers = [u for u in uses if u.kind == "gather"]
    products = [u for u in uses if u.kind in ("dot", "conv")]
    readout = any(u.out in clean for u in products)
    role = "output" if readout else "hidden"

    def classes_of(us):
        cut = next((u.note for u in us if u.note and ("undecided", -1) in u.records), None)
        return cut or _axis_classes(shape, [r for u in us for r in u.records])

    if gathers:
        res = classes_of(gathers)
        if isinstance(res, str):
            return TraceDecision(None, f"embedding lookup: {res}")
        classes, _ = res
        fan_in = tuple(a for a, c in classes.items() if c == "in")
        fan_out = tuple(a for a, c in classes.items() if c == "out")
        how = "trace: embedding lookup (gather)"
        if products:
            pres = classes_of(products)
            if isinstance(pres, str):
                return TraceDecision(None, f"table used as lookup and as product: {pres}")
            pc, _ = pres
            if tuple(a for a, c in pc.items() if c == "in") != fan_out:
                return TraceDecision(None, "table used as lookup and as a product over other axes")
            how += " and product (tied)" + (", read-out" if readout else "")
        if not fan_in or not fan_out:
            return TraceDecision(None, "embedding lookup without a fan-in or fan-out axis")
        return TraceDecision(Geometry(shape, "embedding", fan_in, fan_out, role=role), how)
    if products:
        res = classes_of(products)
        if isinstance(res, str):
            return TraceDecision(None, res)
        classes, splits = res
        fan_in = tuple(a for a, c in classes.items() if c == "in")
        fan_out = tuple(a for a, c in classes.items() if c == "out")
        split_axes = {a: n for a, n in splits.items() if classes[a] == "out"}
        n_split = 1
        if split_axes:
            if len(split_axes) > 1 or min(split_axes) != min(fan_out):
                return TraceDecision(None, f"fan-out cut into blocks on axes {sorted(split_axes)}")
            n_split = next(iter(split_axes.values()))
        if not fan_in or not fan_out:
            return TraceDecision(None, "a product without a fan-in or fan-out axis")
        kinds = sorted({u.kind for u in products})
        how = f"trace: {'/'.join('dot_general' if k == 'dot' else 'conv' for k in kinds)}"
        if n_split > 1:
            how += f", {n_split} blocks used separately"
        if readout:
            how += ", read-out"
        return TraceDecision(Geometry(shape, "matrix", fan_in, fan_out, fan_out_splits=n_split, role=role), how)
    res = classes_of(uses)
    if isinstance(res, str):
        return TraceDecision(None, f"element-wise use: {res}")
    classes, _ = res
    fan_out = tuple(a for a, c in classes.items() if c == "out")
    partner_out = [all_uses[u.partner].out for u in uses if u.partner is not None]
    if len([a for a in fan_out if shape[a] > 1]) > 1 and len(partner_out) < len(uses):
        # Not added to a product's output (a bias over a DenseGeneral's heads x head_dim is): a learned
        # position table added to the embeddings, or a 2-D scale? Element-wise use alone does not say.
        return TraceDecision(None, "element-wise over several axes (a table or a vector?)", defer=True)
    # A bias of the read-out (added to its product) shares its role, as under a head's name.
    role = "output" if any(o in clean for o in partner_out) else "hidden"
    how = "trace: element-wise (bias / scale)" + (", on the read-out" if role == "output" else "")
    return TraceDecision(Geometry(shape, "vector", (), fan_out, role=role), how)


def _abstract(x):
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
    return None


def _static_split(tree):
    """Flatten ``tree``: (leaves, treedef, abstract values of its array leaves, their positions)."""
    flat, tdef = jax.tree_util.tree_flatten(tree)
    abst = [_abstract(x) for x in flat]
    idx = [i for i, x in enumerate(abst) if x is not None]
    return flat, tdef, [abst[i] for i in idx], idx


def _rebuild(flat, tdef, idx, leaves):
    out = list(flat)
    for i, v in zip(idx, leaves):
        out[i] = v
    return jax.tree_util.tree_unflatten(tdef, out)


def _decisions(tr: _Tracer, outs, paths, shapes) -> dict[str, TraceDecision]:
    clean = tr.clean(outs)
    by_param: dict[int, list[_Use]] = {k: [] for k in range(len(paths))}
    for u in tr.uses:
        by_param[u.p].append(u)
    return {path: _decide(shapes[k], by_param[k], clean, tr.uses) for k, path in enumerate(paths)}


def _param_view(k: int, shape: tuple[int, ...]) -> _View:
    return _View(k, tuple(((a, 1, s),) for a, s in enumerate(shape)))


def trace_geometry(apply_fn: Callable, params: Any, *args, **kwargs) -> dict[str, TraceDecision]:
    """Trace ``apply_fn(params, *args, **kwargs)`` on abstract values; decide each parameter.

    Args:
      apply_fn: ``(params, *args, **kwargs) -> outputs`` (the outputs' leaves
        are "the output" for the read-out rule).
      params: the parameter tree (arrays or ``jax.ShapeDtypeStruct``).
      *args: example inputs (arrays or ``jax.ShapeDtypeStruct``; other
        leaves are passed through unchanged, as static values).
      **kwargs: keyword inputs, as ``args``.

    Returns:
      ``{path: TraceDecision}`` for every array leaf of ``params``, paths
      '/'-joined as in :func:`~spectral_optax._geometry.path_str`.
    """
    p_flat, p_def = jax.tree_util.tree_flatten_with_path(params)
    p_abs = [_abstract(x) for _, x in p_flat]
    p_idx = [i for i, x in enumerate(p_abs) if x is not None]
    a_flat, a_def, a_abs, a_idx = _static_split((args, kwargs))

    def fn(p_leaves, a_leaves):
        pl = [x for _, x in p_flat]
        for i, v in zip(p_idx, p_leaves):
            pl[i] = v
        a, kw = _rebuild(a_flat, a_def, a_idx, a_leaves)
        return apply_fn(jax.tree_util.tree_unflatten(p_def, pl), *a, **kw)

    closed = jax.make_jaxpr(fn)([p_abs[i] for i in p_idx], a_abs)
    jaxpr = closed.jaxpr
    shapes = [tuple(p_abs[i].shape) for i in p_idx]  # type: ignore[union-attr]
    tr = _Tracer(shapes)
    in_vals = [tr.fresh() for _ in jaxpr.invars]
    n = len(p_idx)
    for k in range(n):
        tr.views[in_vals[k]] = _param_view(k, shapes[k])
    tr.act.update(in_vals[n:])
    outs = tr.walk(jaxpr, in_vals)
    return _decisions(tr, outs, [path_str(p_flat[i][0]) for i in p_idx], shapes)


def _dead_ends(jaxpr) -> list:
    """The variables an equation makes and nothing uses (nor the jaxpr returns): where a value the
    traced function computes and drops ends (``init``'s forward-pass output)."""
    used = {v for e in jaxpr.eqns for v in e.invars if not isinstance(v, jex_core.Literal)}
    used |= {v for v in jaxpr.outvars if not isinstance(v, jex_core.Literal)}
    return [v for e in jaxpr.eqns for v in e.outvars if v not in used and type(v).__name__ != "DropVar"]


def _param_vars(outvars, paths: list[str]) -> tuple[list[Any], list[str]]:
    """The jaxpr variable of each parameter output, and the paths that have none of their own
    (a literal, or one value returned as two parameters)."""
    out: list[Any] = []
    unmapped, seen = [], set()
    for path, v in zip(paths, outvars):
        if isinstance(v, jex_core.Literal) or v in seen:
            unmapped.append(path)
            out.append(None)
        else:
            seen.add(v)
            out.append(v)
    return out, unmapped


@dataclasses.dataclass
class InitTrace:
    """One trace of an ``init`` that runs the forward pass: the geometry and the values from it.

    Attributes:
      traced: ``jax.jit(init).trace(...)`` (a ``jax.stages.Traced``): its jaxpr is walked for the
        geometry, and lowered and compiled for the values.
      paths: the '/'-joined paths of the parameters.
      shapes: their shapes.
      unmapped: paths of parameters the walk cannot place (made inside a loop, a branch or a
        sub-computation it does not follow, or a constant): decide those by another route.
    """

    traced: Any
    paths: list[str]
    shapes: list[tuple[int, ...]]
    unmapped: list[str]
    _key_leaves: int
    _leaves: list
    _with_output: Callable
    _decisions: dict[str, TraceDecision] | None = None

    def _walk(self, jaxpr, param_vars, outputs: Callable) -> tuple[_Tracer, list]:
        tr = _Tracer(self.shapes)
        seeds = {v: _param_view(k, self.shapes[k]) for k, v in enumerate(param_vars) if v is not None}
        in_vals = [tr.fresh() for _ in jaxpr.invars]
        tr.act.update(in_vals[self._key_leaves :])
        env: dict = {}
        outs = tr.walk(jaxpr, in_vals, seeds, env_out=env)
        return tr, outputs(tr, env, outs)

    def decisions(self) -> dict[str, TraceDecision]:
        """``{path: TraceDecision}``: the forward pass inside the init jaxpr, walked from the
        variables that become the parameters (the activations are the non-``rngs`` inputs). The
        model's output is what ``init`` computes and drops: the dead ends of the jaxpr that carry
        activations (if there is none, the init is traced once more with its output returned)."""
        if self._decisions is None:
            closed = self.traced.jaxpr
            pv, _ = _param_vars(closed.jaxpr.outvars, self.paths)
            dead = _dead_ends(closed.jaxpr)
            tr, outs = self._walk(closed.jaxpr, pv, lambda t, env, _: [env[v] for v in dead if env.get(v) in t.act])
            if not outs:
                closed, n_y = self._with_output()
                pv, _ = _param_vars(closed.jaxpr.outvars[n_y:], self.paths)
                tr, outs = self._walk(closed.jaxpr, pv, lambda t, env, o: o[:n_y])
            self._decisions = _decisions(tr, outs, self.paths, self.shapes)
            self.unmapped = sorted(set(self.unmapped) | {self.paths[k] for k in tr.unmapped})
        return self._decisions

    def values(self):
        """``(params, rest)``: the traced init lowered, compiled and run (no second trace)."""
        return self.traced.lower().compile()(self._leaves)

    def lowered(self):
        """The traced init lowered (for timing: no compile, no run)."""
        return self.traced.lower()


def trace_init(init_fn: Callable, rngs: Any, *args, **kwargs) -> InitTrace:
    """Trace ``init_fn(rngs, *args, **kwargs) -> (outputs, params, rest)`` once, as ``jax.jit`` does.

    The jaxpr of an ``init`` that runs the forward pass (Linen's ``init``)
    contains that forward pass, fed by the variables that become the parameters:
    :meth:`InitTrace.decisions` walks it from those variables (as
    :func:`trace_geometry` walks an ``apply`` from its inputs) and
    :meth:`InitTrace.values` compiles the same trace for the parameters, so that
    init and geometry cost one trace of the model.

    Args:
      init_fn: ``(rngs, *args, **kwargs) -> (outputs, params, rest)``: the model's
        outputs (dropped from the traced function; returned only if a second trace is
        needed for the read-out), the parameter tree, any other variables.
      rngs: the PRNG key(s) (not activations).
      *args: example inputs (arrays or ``jax.ShapeDtypeStruct``; other leaves are static).
      **kwargs: keyword inputs, as ``args``.

    Returns:
      An :class:`InitTrace`.
    """
    flat, tdef, abst, idx = _static_split((rngs, args, kwargs))
    n_keys = len([i for i in idx if i < len(jax.tree_util.tree_leaves(rngs))])

    def full(leaves):
        r, a, kw = _rebuild(flat, tdef, idx, leaves)
        return init_fn(r, *a, **kw)

    traced = jax.jit(lambda leaves: full(leaves)[1:]).trace(abst)
    p_flat = jax.tree_util.tree_flatten_with_path(traced.out_info[0])[0]
    paths = [path_str(p) for p, _ in p_flat]
    shapes = [tuple(x.shape) for _, x in p_flat]
    _, unmapped = _param_vars(traced.jaxpr.jaxpr.outvars, paths)

    def with_output():
        closed, out_shape = jax.make_jaxpr(full, return_shape=True)(abst)
        return closed, len(jax.tree_util.tree_leaves(out_shape[0]))

    leaves = [flat[i] for i in idx]
    return InitTrace(traced, paths, shapes, unmapped, n_keys, leaves, with_output)
