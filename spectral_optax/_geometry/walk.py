"""The walk of a jaxpr: every parameter's axes followed to the ops that consume it.

:class:`_Tracer` walks the equations of a jaxpr (and the sub-jaxprs of
``jit`` / ``custom_jvp`` / ``custom_vjp`` / ``remat``, ``scan``, ``while`` and
``cond``). A value derived from parameter ``p`` by ops that only move axes is a
view of ``p``: for each of its dimensions, the pieces of ``p``'s axes it
carries. Each op that consumes a view is recorded as a use of ``p`` with the
class of every axis it sees (``'in'`` contracted with an activation, ``'out'``,
``'batch'``, or a block of an axis cut into equal parts); a product's output
is followed forward to where it is cut into blocks (a cut whose blocks are
re-joined is void, :meth:`_Tracer.finish`). The graph of values, with
the parametrized products marked, is kept for the read-out rule
(:meth:`_Tracer.clean`). :mod:`spectral_optax._geometry.trace` turns the uses
into decisions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from jax.extend import core as jex_core

from spectral_optax._geometry.views import (
    _ELEMENTWISE,
    _REDUCTIONS,
    _REJOIN,
    _STRUCTURAL_UNARY,
    _Cut,
    _cut,
    _Dims,
    _gathered_dims,
    _has_jaxpr,
    _move_dims,
    _ProdOut,
    _sub_jaxpr,
    _Use,
    _View,
)


class _Tracer:
    def __init__(self, shapes: Sequence[tuple[int, ...]]):
        self.shapes = [tuple(s) for s in shapes]
        self.views: dict[int, _View] = {}
        self.prods: dict[int, _ProdOut] = {}
        self.act: set[int] = set()
        self.uses: list[_Use] = []
        self.nodes: list[tuple[list[int], list[int], bool]] = []
        self.unmapped: set[int] = set()  # parameters made (in an init trace) where the walk cannot seed them
        self.cuts: list[_Cut] = []
        self._cut_ids: dict[tuple, int] = {}
        # A whole-slice gather of a parameter (expert weights picked by index): its view, and the gather use
        # it replaces if a product consumes it as a weight.
        self.gathered: dict[int, tuple[_View, int]] = {}
        self._feeds: set[int] | None = None
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
        if any(v in self.gathered for v in ins if v is not None) and not any(views):
            if self.follow_gathered(eqn, name, p, ins, outs):
                self.nodes.append(([v for v in ins if v is not None], outs, True))
                return list(outs)
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
        if name in ("broadcast_in_dim", "tile") and any(
            all(pc[0] < 0 for pc in d) and int(s) > 1
            for d, s in zip(_move_dims(name, p, view.dims, in_shapes[vi], out_shape) or (), out_shape)
        ):
            return self.token(view, outs[0])  # a learned token tiled over the batch: a constant input
        if name == "concatenate" and any(v in self.act for v in ins if v is not None) and sum(map(bool, views)) == 1:
            return self.token(view, outs[0])  # a class / register token concatenated with the activations
        if name in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim", "tile"):
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
            self.per_block(other, lb if vi == 1 else rb)
            # Product output: (batch, lhs free, rhs free); follow the parameter's free dims.
            other_free = [d for d in range(len(in_shapes[1 - vi])) if d not in (rc if vi == 0 else lc)]
            other_free = [d for d in other_free if d not in (rb if vi == 0 else lb)]
            free = [d for d in range(nd) if d not in contract and d not in batch]
            act_dims = tuple(((-1, 1, in_shapes[1 - vi][d]),) for d in other_free)
            mine = tuple(view.dims[d] for d in free)
            bdims = tuple(((-2, 1, in_shapes[vi][d]),) for d in batch)  # -2: a dot_general batch dim
            self.prods[outs[0]] = _ProdOut(u, bdims + (mine + act_dims if vi == 0 else act_dims + mine))
            return True
        if name == "ragged_dot_general":
            rdn = p["ragged_dot_dimension_numbers"]
            (lc, rc), (lb, rb) = rdn.dot_dimension_numbers
            if vi != 1 or ins[0] not in self.act or views[0] is not None:
                self.use(view, "opaque", note="ragged_dot_general with the parameter as the ragged operand")
                return False
            groups = tuple(rdn.rhs_group_dimensions)
            nd = len(view.dims)
            classes = {d: "in" for d in rc} | {d: "batch" for d in tuple(rb) + groups}
            classes |= {d: "out" for d in range(nd) if d not in classes}
            u = self.use(view, "dot", self.classify(view, classes), out=outs[0])
            lhs_free = [d for d in range(len(in_shapes[0])) if d not in lc and d not in lb]
            free = [d for d in range(nd) if classes[d] == "out"]
            bdims = tuple(((-2, 1, in_shapes[1][d]),) for d in rb)
            act_dims = tuple(((-1, 1, in_shapes[0][d]),) for d in lhs_free)
            self.prods[outs[0]] = _ProdOut(u, bdims + act_dims + tuple(view.dims[d] for d in free))
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
            u = self.use(view, "gather", self.classify(view, classes))
            picked = _gathered_dims(dn, sizes, shape, view.dims, out_shape)
            if picked is not None:  # whole slices picked by index: expert weights, if a product takes them
                batch = tuple(("batch", a) for d in dn.start_index_map for a, _, _ in view.dims[d] if a >= 0)
                self.gathered[outs[0]] = (_View(view.p, picked, view.extra + batch), u)
            return False
        if name in _ELEMENTWISE:
            others = [v for i, v in enumerate(ins) if i != vi and v is not None]
            if any(v in self.act for v in others):
                every = {d: "out" for d in range(len(view.dims))}
                partner = next((self.prods[v] for v in others if v in self.prods), None)
                table = sum(n > 1 for n in self.shapes[view.p]) >= 2
                spread = any(  # a dimension of size 1 the op broadcasts over the activations' (batch)
                    math.prod(pc[2] for pc in d) == 1 and int(n) > 1 for d, n in zip(view.dims, out_shape)
                )
                if partner is None and table and spread and len(view.dims) == len(out_shape):
                    return self.token(view, outs[0])  # a position table added to the activations
                if partner is not None and len(partner.dims) == len(view.dims):
                    # A bias on a product's output: its axes over the product's batch dims (ConvLocal's
                    # positions, per-expert outputs) are batch axes too.
                    every = {d: "batch" if any(pc[0] == -2 for pc in partner.dims[d]) else "out" for d in every}
                u = self.use(view, "elementwise", self.classify(view, every))
                self.uses[u].partner = partner.use if partner is not None else None
            elif tuple(out_shape) == tuple(in_shapes[vi]):
                self.views[outs[0]] = view  # scaled by a constant / by itself: still the parameter
            if name == "mul" and not any(v in self.act for v in others):
                # A gain multiplied into another parameter (weight normalization's g): a vector over its
                # axes of size > 1; the product keeps the view of the parameter it has the shape of.
                for i, w in enumerate(views):
                    if w is not None and tuple(in_shapes[i]) != tuple(out_shape):
                        gain = {d: "out" for d, n in enumerate(in_shapes[i]) if n > 1}
                        self.use(w, "gain", self.classify(w, gain))
                    elif w is not None and i != vi:
                        self.views[outs[0]] = w
            return False
        if name in _REDUCTIONS:
            return False  # a norm of the parameter (weight normalization): not a use
        self.use(view, "opaque", note=f"consumed by {name!r}")
        return False

    def token(self, view: _View, out: int) -> bool:
        """A parameter tiled over the batch or concatenated with the activations (a query probe, a class or
        register token): a constant input, recorded as a ``'token'`` use over its axes of size > 1; what it
        makes is an activation."""
        recs = [
            r for r in self.classify(view, {d: "out" for d in range(len(view.dims))}) if self.shapes[view.p][r[1]] > 1
        ]
        self.use(view, "token", recs)
        self.act.add(out)
        return False

    def per_block(self, other: int | None, batch_dims: Sequence[int]) -> None:
        """A product's output taken by another parametrized product with its dims ``batch_dims`` as
        ``dot_general`` batch dimensions (experts: ``'nd,edf->enf'`` then ``'enf,efd->end'``): each index
        of the parameter axes those dims carry is its own block."""
        po = self.prods.get(other) if other is not None else None
        if po is None:
            return
        for d in batch_dims:
            for a, o, s in po.dims[d]:
                if a >= 0:
                    self.uses[po.use].records.append(("block", a, o * s))

    def follow_gathered(self, eqn, name, p, ins, outs) -> bool:
        """Follow whole slices of a parameter picked by a gather; True if a product takes them as weight."""
        gi = next(i for i, v in enumerate(ins) if v in self.gathered)
        view, gu = self.gathered[ins[gi]]
        in_shape = tuple(eqn.invars[gi].aval.shape)
        out_shape = tuple(eqn.outvars[0].aval.shape)
        if name == "dot_general" and ins[1 - gi] in self.act and ins[1 - gi] not in self.gathered:
            (lc, rc), (lb, rb) = p["dimension_numbers"]
            contract, batch = (lc, lb) if gi == 0 else (rc, rb)
            classes = {d: "in" for d in contract} | {d: "batch" for d in batch}
            classes |= {d: "out" for d in range(len(view.dims)) if d not in classes}
            recs = self.classify(view, classes)
            if not {"in", "out"} <= {r[0] for r in recs}:
                return False  # looked-up rows contracted with an activation (a sampled softmax): a table
            u = self.use(view, "dot", recs, out=outs[0])
            self.uses[gu].kind = "selection"  # the gather picked the slices this product uses: not a lookup
            free = [d for d in range(len(view.dims)) if d not in contract and d not in batch]
            other_free = [d for d in range(len(eqn.invars[1 - gi].aval.shape))
                          if d not in (rc if gi == 0 else lc) and d not in (rb if gi == 0 else lb)]  # fmt: skip
            act_dims = tuple(((-1, 1, eqn.invars[1 - gi].aval.shape[d]),) for d in other_free)
            mine = tuple(view.dims[d] for d in free)
            bdims = tuple(((-2, 1, in_shape[d]),) for d in batch)
            self.prods[outs[0]] = _ProdOut(u, bdims + (mine + act_dims if gi == 0 else act_dims + mine))
            return True
        dims: _Dims | None = None
        if name in _STRUCTURAL_UNARY:
            dims = view.dims
        elif name == "transpose":
            dims = tuple(view.dims[i] for i in p["permutation"])
        elif name in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim"):
            dims = _move_dims(name, p, view.dims, in_shape, out_shape)
        if dims is not None:
            self.gathered[outs[0]] = (dataclasses.replace(view, dims=dims), gu)
        return False

    def finish(self) -> None:
        """Apply the cuts whose blocks were used separately (never re-joined) to their products' uses."""
        for c in self.cuts:
            if c.rejoined:
                continue
            self.uses[c.use].records.extend(c.records)
            if c.note:
                self.uses[c.use].note = c.note
        self.cuts = [c for c in self.cuts if c.rejoined]

    # ---- product outputs, followed forward to a split ----------------------
    def follow_product(self, eqn, name, p, ins, outs, in_shapes, out_shape) -> None:
        prods = [(i, self.prods[v]) for i, v in enumerate(ins) if v is not None and v in self.prods]
        if not prods:
            return
        i, po = prods[0]
        if name in _STRUCTURAL_UNARY or name == "rev":
            self.prods[outs[0]] = po
        elif name == "transpose":
            self.prods[outs[0]] = _ProdOut(po.use, tuple(po.dims[d] for d in p["permutation"]), po.tags)
        elif name in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim"):
            dims = _move_dims(name, p, po.dims, in_shapes[i], out_shape)
            if dims is not None:
                self.prods[outs[0]] = _ProdOut(po.use, dims, po.tags)
        elif name in ("slice", "dynamic_slice", "split") and i == 0:
            res = _cut(name, p, po.dims, in_shapes[i], [tuple(o.aval.shape) for o in eqn.outvars])
            cut_dims = (
                (p["axis"],)
                if name == "split"
                else tuple(d for d in range(len(in_shapes[i])) if eqn.outvars[0].aval.shape[d] != in_shapes[i][d])
            )
            key = (ins[i], name == "split", cut_dims)
            if key not in self._cut_ids:
                self._cut_ids[key] = len(self.cuts)
                self.cuts.append(_Cut(po.use, []))
            cid = self._cut_ids[key]
            blocks: list[Any]
            if name == "split":
                blocks = list(range(len(outs)))
            elif name == "slice":
                blocks = [tuple(p["start_indices"][d] for d in cut_dims)]
            else:
                blocks = [outs[0]]
            if res is None:
                sizes = f" of sizes {tuple(int(n) for n in p['sizes'])}" if name == "split" else ""
                self.cuts[cid].records = [("undecided", -1)]
                self.cuts[cid].note = (
                    f"its product is cut ({name}) into unequal or strided blocks{sizes} (a fused projection of "
                    "different widths, e.g. grouped-query q / k / v): a Geometry splits a fan-out only into "
                    "equal blocks. Override it as one matrix, or keep the blocks as separate parameters"
                )
                dims_list: list[_Dims] = [tuple(((-1, 1, int(n)),) for n in o.aval.shape) for o in eqn.outvars]
            else:
                recs, dims_list = res
                if not self.cuts[cid].note:
                    self.cuts[cid].records = recs
            for o, dims, b in zip(outs, dims_list, blocks):
                self.prods[o] = _ProdOut(po.use, dims, po.tags | {(cid, b)})
        elif name in _REJOIN:
            tags = frozenset().union(*(q.tags for _, q in prods))
            seen: dict[int, set] = {}
            for cid, b in tags:
                seen.setdefault(cid, set()).add(b)
            for cid, bs in seen.items():
                if len(bs) > 1:
                    self.cuts[cid].rejoined = True
            if len({q.use for _, q in prods}) == 1:  # still that product's output, its blocks side by side
                same = name == "complex" and tuple(out_shape) == tuple(in_shapes[i])
                dims = po.dims if same else tuple(((-1, 1, int(n)),) for n in out_shape)
                self.prods[outs[0]] = _ProdOut(po.use, dims, tags)
        elif name in _ELEMENTWISE and tuple(out_shape) == tuple(in_shapes[i]):
            if len({q.use for _, q in prods}) == 1:  # one product's blocks (a rotation mixes them)
                self.prods[outs[0]] = _ProdOut(po.use, po.dims, frozenset().union(*(q.tags for _, q in prods)))

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

    def readouts(self, outvals: Sequence[int | None]) -> set[int]:
        """The read-out values of ``outvals`` (what the loss reads): values from which ``outvals`` are
        reached without a parametrized product and from which no parametrized product is reached. A
        product whose output is one of them is a read-out (docs/math.md, "The read-out"); a product whose
        output also feeds another parametrized product (a router's gates, an encoder state that the
        decoder reads, a returned per-layer output) computes features, not the loss's input."""
        if self._feeds is None:
            self._feeds = self.clean([v for ins, _, blocking in self.nodes if blocking for v in ins])
        return self.clean(outvals) - self._feeds
