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
  else ``fan_out_splits`` blocks. A cut of a product's output whose blocks
  meet again in a ``concatenate`` / ``stack`` / ``complex`` (a rotary
  embedding's halves, interleaved pairs or complex rotation) was not used
  separately: it leaves no blocks;
* a product's output dimension that a later parametrized product takes as a
  ``dot_general`` batch dimension (experts: ``'nd,edf->enf'``, then
  ``'enf,efd->end'``), ``ragged_dot``'s group axis, and the axis a gather picks
  whole slices of for a product (gathered expert weights): batch axes;
* a parameter tiled / broadcast over a new axis or concatenated with the
  activations (a query probe, a class or register token): a constant input,
  a vector (one token) or an embedding (several).

The read-out (``role='output'``) is what the loss reads (docs/math.md, "The
read-out"): a parametrized product whose result reaches the loss's input without
passing through another parametrized product and feeds no parametrized product.
The loss's input is the selected part of the returned value (``output=``: a
selector such as ``lambda out: out["logits"]``, or a loss traced instead), by
default the first array leaf of the returned value; where another returned leaf
would make another product a read-out, a ``GeometryWarning`` names it and the
selector. A table used both as lookup and as product (a tied embedding) is an
embedding; read out, it gets ``role='output'``.

Anything else (an opaque primitive or callback, uses that disagree, an axis
cut in blocks that a :class:`~spectral_optax.Geometry` cannot express) leaves the parameter
undecided with the reason, and :class:`~spectral_optax.GeometryMap` handles it
(module hint, else the element-wise fallback with a ``GeometryWarning``).
``trace_init(init_fn, rngs, *args)`` does the same from one trace of an
``init`` that runs the forward pass (Linen's ``init``, as ``jax.jit`` traces
it): the walk starts from the variables that become the parameters (seeded
where they are made, inside ``scan`` / ``jit`` bodies too), the read-out is
judged at the model's output (marked in the trace, so that per-layer outputs
of a scan body that the model drops are not outputs), and
the same trace is compiled for the values, so that init and geometry cost one
trace of the model.

A parameter used only element-wise over two or more axes (a learned position
table added to the activations, a 2-D bias) is deferred to the hints and name
rules, since element-wise use alone does not say whether it is a table or a
vector. docs/guide.md lists the rules and their order.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jex_core

from spectral_optax._geometry.types import Geometry, GeometryWarning, _leaves_with_paths, path_str
from spectral_optax._geometry.views import _param_view, _Use
from spectral_optax._geometry.walk import _Tracer


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


def _out_cut_per_index(shape, axis: int, products: list[_Use]) -> bool:
    """Whether ``axis`` is a fan-out axis of every product that its blocks, one index each, cut."""
    recs = [r for u in products for r in u.records if len(r) >= 2 and r[1] == axis]
    return bool(recs) and all(r[0] == "out" or (r[0] == "block" and r[2] == shape[axis]) for r in recs)


#: What a parameter whose every use is a gain / a token is, when its axes disagree.
_ONLY_USE = {
    "gain": "a gain multiplied into another parameter",
    "token": "a token tiled / concatenated into the activations",
}


def _decide(shape, uses: list[_Use], clean: set[int], all_uses: list[_Use]) -> TraceDecision:
    """One parameter's decision from its uses; ``clean`` holds the read-out values (:meth:`_Tracer.readouts`)."""
    shape = tuple(shape)
    uses = [u for u in uses if u.kind != "selection"]  # a gather of whole slices that a product then takes
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
        if fan_in and not fan_out:
            # Every fan-out index used on its own (a question-answering head (d, 2) whose product is cut
            # into start and end logits): the fan-out is that many blocks of width 1.
            cut = [a for a in classes if classes[a] == "batch" and _out_cut_per_index(shape, a, products)]
            if len(cut) == 1:
                fan_out, n_split = (cut[0],), shape[cut[0]]
        if not fan_in or not fan_out:
            return TraceDecision(None, "a product without a fan-in or fan-out axis")
        kinds = sorted({u.kind for u in products})
        how = f"trace: {'/'.join('dot_general' if k == 'dot' else 'conv' for k in kinds)}"
        if n_split > 1:
            how += f", {n_split} blocks used separately"
        if readout:
            how += ", read-out"
        return TraceDecision(Geometry(shape, "matrix", fan_in, fan_out, fan_out_splits=n_split, role=role), how)
    kind = uses[0].kind
    if kind in _ONLY_USE and all(u.kind == kind for u in uses):  # only gains, or only tokens
        res = classes_of(uses)
        if isinstance(res, str):
            return TraceDecision(None, f"{_ONLY_USE[kind]}: {res}")
        big = tuple(a for a, c in res[0].items() if c == "out")
        if kind == "gain":
            return TraceDecision(Geometry(shape, "vector", (), big), "trace: a gain of another parameter (vector)")
        how = "trace: a learned token tiled over the batch / concatenated with the activations"
        if len(big) <= 1:  # one learned input vector: a matrix fed by a constant input of width 1
            return TraceDecision(Geometry(shape, "vector", (), big), how + " (a constant input)")
        # Several learned vectors (register tokens, a table added at every position): a table read by
        # every one-hot index at once.
        return TraceDecision(Geometry(shape, "embedding", big[:-1], big[-1:]), how + " (a table of tokens)")
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


def _decisions(tr: _Tracer, outs, paths, shapes, others=()) -> dict[str, TraceDecision]:
    """Every parameter's decision; ``outs`` are the loss's input (the selected output) and ``others``
    ``[(name, values)]`` the other leaves of the returned value, checked by :func:`_warn_other_outputs`."""
    tr.finish()
    clean = tr.readouts(outs)
    by_param: dict[int, list[_Use]] = {k: [] for k in range(len(paths))}
    for u in tr.uses:
        by_param[u.p].append(u)
    _warn_other_outputs(tr, clean, others, paths)
    return {path: _decide(shapes[k], by_param[k], clean, tr.uses) for k, path in enumerate(paths)}


def _warn_other_outputs(tr: _Tracer, clean: set[int], others, paths) -> None:
    """A :class:`~spectral_optax.GeometryWarning` if a returned leaf other than the one taken as the loss's
    input would make other parametrized products read-outs: it names those leaves, their products'
    parameters, and the ``output=`` selector that says which one the loss reads."""
    found = []
    products = [u for u in tr.uses if u.kind in ("dot", "conv")]
    read = {u.p for u in products if u.out in clean}
    for name, vals in others:
        extra = tr.readouts(vals) - clean
        ps = sorted({paths[u.p] for u in products if u.out in extra and u.p not in read})
        if ps:
            found.append((name, ps))
    if not found:
        return
    shown = "; ".join(f"out{n} (reached by the product of {', '.join(repr(p) for p in ps[:4])})" for n, ps in found)
    first = found[0][0]
    warnings.warn(
        "the model returns more than one array: the first array leaf is taken as what the loss reads (its "
        f"logits), and the read-out is the layer that computes it. The returned value also holds {shown}, "
        "which would make those layers read-outs if the loss read them. If the loss reads another leaf, "
        f"say which: output=lambda out: out{first} (or a loss traced instead: output=lambda out: "
        "loss_fn(out, labels)).",
        GeometryWarning,
        stacklevel=4,
    )


def _selector(output) -> Callable | None:
    """``output=`` as a callable: ``None`` (the first array leaf), a callable (a selector of the returned
    value, or a loss traced instead), or an index / key (``out[output]``)."""
    if output is None or callable(output):
        return output
    if isinstance(output, (int, str)):
        return lambda out: out[output]
    raise TypeError(
        f"output= must be a callable (a selector of the model's returned value, e.g. lambda out: out[0], or a "
        f"loss traced instead), an index or a key; got {type(output).__name__}"
    )


def _split_outputs(out_tree, values) -> tuple[list, list]:
    """``(primary, others)``: the first array leaf's value, and ``[(keystr, [value])]`` for the others."""
    flat, _ = jax.tree_util.tree_flatten_with_path(out_tree)
    arr = [(jax.tree_util.keystr(k), v) for (k, x), v in zip(flat, values) if hasattr(x, "shape")]
    if not arr:
        return list(values), []
    return [arr[0][1]], [(n, [v]) for n, v in arr[1:]]


def trace_geometry(apply_fn: Callable, params: Any, *args, output: Any = None, **kwargs) -> dict[str, TraceDecision]:
    """Trace ``apply_fn(params, *args, **kwargs)`` on abstract values; decide each parameter.

    Args:
      apply_fn: ``(params, *args, **kwargs) -> outputs``.
      output: what the loss reads, for the read-out rule: ``None`` (the first array leaf of
        ``outputs``, with a warning if another leaf would make other read-outs), a callable applied to
        ``outputs`` (a selector, or a loss traced instead; all its leaves are read), or an index / key.
      params: the parameter tree (arrays or ``jax.ShapeDtypeStruct``).
      *args: example inputs (arrays or ``jax.ShapeDtypeStruct``; other
        leaves are passed through unchanged, as static values).
      **kwargs: keyword inputs, as ``args``.

    Returns:
      ``{path: TraceDecision}`` for every array leaf of ``params``, paths
      '/'-joined as in :func:`~spectral_optax._geometry.types.path_str`.
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
        out = apply_fn(jax.tree_util.tree_unflatten(p_def, pl), *a, **kw)
        return out if select is None else select(out)

    select = _selector(output)
    closed, out_tree = jax.make_jaxpr(fn, return_shape=True)([p_abs[i] for i in p_idx], a_abs)
    jaxpr = closed.jaxpr
    shapes = [tuple(p_abs[i].shape) for i in p_idx]  # type: ignore[union-attr]
    tr = _Tracer(shapes)
    in_vals = [tr.fresh() for _ in jaxpr.invars]
    n = len(p_idx)
    for k in range(n):
        tr.views[in_vals[k]] = _param_view(k, shapes[k])
    tr.act.update(in_vals[n:])
    outs = tr.walk(jaxpr, in_vals)
    primary, others = _split_outputs(out_tree, outs) if select is None else (outs, [])
    return _decisions(tr, primary, [path_str(p_flat[i][0]) for i in p_idx], shapes, others)


#: The name that :func:`trace_init` gives the model's outputs in the init jaxpr (``checkpoint_name``: an
#: identity that lowering drops with the rest of the unused forward pass).
_OUTPUT_MARK = "spectral_optax:model_output"


def _marked_outputs(jaxpr) -> tuple[list, list[tuple[str, list]]]:
    """The variables :func:`trace_init` marked as the model's outputs (top level of ``jaxpr``):
    ``(what the loss reads, [(keystr, [variable])] for the other returned leaves)``."""
    main, others = [], []
    for e in jaxpr.eqns:
        name = e.params.get("name") if e.primitive.name == "name" else None
        if name == _OUTPUT_MARK:
            main.append(e.invars[0])
        elif isinstance(name, str) and name.startswith(_OUTPUT_MARK + "|"):
            others.append((name[len(_OUTPUT_MARK) + 1 :], [e.invars[0]]))
    return main, others


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
        activations (if there is none, the init is traced once more with its output returned).

        The model's outputs are marked in the trace (:data:`_OUTPUT_MARK`), so that a value the
        model computes and drops (the per-layer outputs of a scan body) is no output; without the
        marks, every value the init drops is taken as an output."""
        if self._decisions is None:
            closed = self.traced.jaxpr
            pv, _ = _param_vars(closed.jaxpr.outvars, self.paths)
            marked, other_vars = _marked_outputs(closed.jaxpr)
            dead = marked or _dead_ends(closed.jaxpr)
            others: list = []

            def pick(t, env, _):
                others[:] = [(n, [env.get(v) for v in vs]) for n, vs in other_vars]
                return [env[v] for v in dead if env.get(v) in t.act]

            tr, outs = self._walk(closed.jaxpr, pv, pick)
            if not outs:
                closed, n_y = self._with_output()
                pv, _ = _param_vars(closed.jaxpr.outvars[n_y:], self.paths)
                tr, outs = self._walk(closed.jaxpr, pv, lambda t, env, o: o[:n_y])
                others = []
            self._decisions = _decisions(tr, outs, self.paths, self.shapes, others)
            self.unmapped = sorted(set(self.unmapped) | {self.paths[k] for k in tr.unmapped})
        return self._decisions

    def values(self):
        """``(params, rest)``: the traced init lowered, compiled and run (no second trace)."""
        return self.traced.lower().compile()(self._leaves)

    def lowered(self):
        """The traced init lowered (for timing: no compile, no run)."""
        return self.traced.lower()


def trace_init(init_fn: Callable, rngs: Any, *args, output: Any = None, **kwargs) -> InitTrace:
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
      output: what the loss reads, as in :func:`trace_geometry`.
      **kwargs: keyword inputs, as ``args``.

    Returns:
      An :class:`InitTrace`.
    """
    flat, tdef, abst, idx = _static_split((rngs, args, kwargs))
    n_keys = len([i for i in idx if i < len(jax.tree_util.tree_leaves(rngs))])

    select = _selector(output)

    def full(leaves):
        r, a, kw = _rebuild(flat, tdef, idx, leaves)
        y, *rest = init_fn(r, *a, **kw)
        return (y if select is None else select(y), *rest)

    def marked(leaves):
        out = full(leaves)
        first = True
        for k, y in jax.tree_util.tree_flatten_with_path(out[0])[0]:
            if not hasattr(y, "shape"):
                continue
            # The first array leaf is what the loss reads (all of a selection); the others are named for
            # the warning. checkpoint_name is unused: it only names the value in the jaxpr.
            name = _OUTPUT_MARK if first or select is not None else f"{_OUTPUT_MARK}|{jax.tree_util.keystr(k)}"
            first = False
            if isinstance(y, jax.core.Tracer):
                checkpoint_name(y, name)
        return out[1:]

    traced = jax.jit(marked).trace(abst)
    p_leaves = _leaves_with_paths(traced.out_info[0])
    paths = [p for p, _ in p_leaves]
    shapes = [tuple(x.shape) for _, x in p_leaves]
    _, unmapped = _param_vars(traced.jaxpr.jaxpr.outvars, paths)

    def with_output():
        closed, out_shape = jax.make_jaxpr(full, return_shape=True)(abst)
        return closed, len(jax.tree_util.tree_leaves(out_shape[0]))

    leaves = [flat[i] for i in idx]
    return InitTrace(traced, paths, shapes, unmapped, n_keys, leaves, with_output)
