"""The resolver: one :class:`Geometry` for every leaf of a parameter tree, decided once.

:class:`GeometryMap` applies the rules in order (override, explicit geometry
tree, the traced computation, a Flax module hint, the name rules, else the
element-wise fallback) and records which rule decided each leaf;
:func:`as_geometry_map` turns every accepted ``geometry=`` argument into one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from spectral_optax._geometry.flax_hints import (
    _hints_from_nnx,
    _is_nnx_module,
    _Layout,
    _linen_decisions,
    _linen_init_trace,
    _nnx_apply,
    _nnx_param_paths,
)
from spectral_optax._geometry.names import (
    _GQA_FUSED_NAME,
    _default_head,
    _default_head_warning,
    _from_names,
    _fused_qkv_splits,
    _gqa_fused_warning,
    _is_output_path,
)
from spectral_optax._geometry.overrides import (
    Override,
    _apply_override,
    _compile_overrides,
    _looks_like_regex_dict,
    _override_help,
)
from spectral_optax._geometry.stacked import drop_axis, insert_axis, stacked_groups, suggested_axes
from spectral_optax._geometry.trace import trace_geometry
from spectral_optax._geometry.types import (
    ELEMENTWISE,
    Geometry,
    GeometryError,
    GeometryWarning,
    UndecidableGeometryError,
    _leaves_with_paths,
    path_str,
)


def _trace_or_warn(trace_fn: Callable, *args, **kwargs):
    """The trace's decisions; ``None`` with a :class:`~spectral_optax.GeometryWarning` if the model does not trace."""
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


class GeometryMap:
    """Decides the :class:`~spectral_optax.Geometry` of every leaf of a parameter tree.

    Resolution order for a leaf with '/'-joined path ``path``:
      1. the first override whose regex ``re.search``-es ``path``;
      2. an exact entry of an explicit geometry tree;
      3. the traced computation (:meth:`from_apply`, and :meth:`from_linen` /
         :meth:`from_nnx` with example inputs): the primitives that consume
         the parameter decide it (see ``spectral_optax._geometry.trace``);
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
    back to ``Geometry.elementwise(shape)`` with a :class:`~spectral_optax.GeometryWarning`
    naming its path and the override that fixes it: every named optimizer
    has an element-wise route for it (as ``optax.contrib.muon`` sends non-2-D
    leaves to Adam). With ``strict=True`` such a leaf raises
    :class:`~spectral_optax.GeometryError` instead. The decision is made once per leaf, here.

    Args:
      overrides: ``{regex: override}``: an override (a :class:`~spectral_optax.Geometry`, a kind
        name, or a dict of :class:`~spectral_optax.Geometry` fields) for every leaf whose path
        the regex ``re.search``-es (rule 1).
      tree: an explicit geometry tree: leaves of :class:`~spectral_optax.Geometry`, or Muon dimension
        numbers (``optax.contrib.MuonDimensionNumbers``: an optax or MaxText
        ``muon_weight_dimension_numbers`` tree), nested like the params they describe (rule 2;
        a ``None`` leaf is decided by the other rules).
      hints: layout hints by module path, as recorded by :meth:`from_linen` /
        :meth:`from_nnx` (rule 4; rarely given by hand).
      strict: raise :class:`~spectral_optax.GeometryError` instead of the element-wise fallback.
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
        self.explicit: dict[str, Any] = {}
        if tree is not None:
            leaf = lambda x: isinstance(x, Geometry) or _is_dimension_numbers(x)  # noqa: E731
            flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=leaf)
            for p, g in flat:
                if leaf(g):
                    self.explicit[path_str(p)] = g
        self.hints = dict(hints or {})
        self._cache: dict[tuple, tuple[Geometry, ...]] = {}
        self._decided: dict[tuple[str, tuple[int, ...]], Geometry] = {}
        self._how: dict[tuple[str, tuple[int, ...]], str] = {}
        self._checked: set[tuple[str, ...]] = set()
        self._stack_cache: dict[int, tuple[Any, dict]] = {}

    # -- constructors from models -------------------------------------------
    @classmethod
    def from_apply(
        cls,
        apply_fn: Callable,
        params,
        *example_args,
        output=None,
        overrides=None,
        strict: bool = False,
        **example_kwargs,
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
          output: what the loss reads, which decides the read-out (docs/math.md, "The read-out"): a
            selector of the returned value (``lambda out: out["logits"]``, ``lambda out: out[0]``), a loss
            traced instead (``lambda out: loss_fn(out, labels)``), or an index / key; ``None`` takes the
            first array leaf of the returned value (logits first, as Flax, Hugging Face and big_vision
            return them) and warns if another returned leaf would make other layers read-outs.
          overrides: ``{regex: override}``, applied before the trace.
          strict: raise instead of the element-wise fallback for undecided leaves.
          **example_kwargs: keyword inputs of ``apply_fn``.

        Raises:
          GeometryError: ``apply_fn`` could not be traced on abstract inputs.
        """
        try:
            traced = trace_geometry(apply_fn, params, *example_args, output=output, **example_kwargs)
        except Exception as e:  # noqa: BLE001 - any tracing failure, reported with its cause
            raise GeometryError(
                f"GeometryMap.from_apply could not trace apply_fn on abstract inputs ({type(e).__name__}: {e}). "
                "apply_fn(params, *example_args) must be traceable by jax.make_jaxpr (no Python control flow "
                "on values); otherwise use GeometryMap.from_linen / from_nnx hints or overrides."
            ) from e
        return cls(overrides, strict=strict, traced=traced)

    @classmethod
    def from_nnx(
        cls, module, *example_args, output=None, overrides=None, strict: bool = False, **example_kwargs
    ) -> GeometryMap:
        """Layouts read from a live ``flax.nnx`` module; traced when example inputs are given.

        Args:
          module: the ``nnx.Module``.
          *example_args: example inputs of ``module(*example_args)``; with them the
            forward pass is traced as in :meth:`from_apply` (the trace decides,
            the module hints are the cross-check and the fallback).
          output, overrides, strict: as in :meth:`from_apply` (what the loss reads; ``{regex: override}``
            applied first; raise on undecided leaves).
          **example_kwargs: keyword inputs of the module call.
        """
        hints = _hints_from_nnx(module)
        traced = None
        if not (example_args or example_kwargs):
            paths = _nnx_param_paths(module)
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
            apply, state = _nnx_apply(module)
            traced = _trace_or_warn(trace_geometry, apply, state, *example_args, output=output, **example_kwargs)
        return cls(overrides, hints=hints, strict=strict, traced=traced)

    @classmethod
    def from_linen(cls, module, *args, output=None, overrides=None, strict: bool = False, **kwargs) -> GeometryMap:
        """Layouts from a Linen module, traced (shapes only) on ``args``.

        One trace of ``module.init(key, *args, **kwargs)`` as ``jax.jit`` makes it
        (abstract values: no FLOPs): the forward pass inside it decides each parameter
        as in :meth:`from_apply`, walked from the variables that become the parameters;
        the module hints (Dense, DenseGeneral, Conv, Embed, Einsum, norms) recorded
        in the same trace are the cross-check and the fallback. To get the
        variables too, from the same trace, use :func:`~spectral_optax.init_with_geometry`.

        Args:
          module: the Linen module.
          *args: example inputs.
          output, overrides, strict: as in :meth:`from_apply` (what the loss reads; ``{regex: override}``
            applied first; raise on undecided leaves).
          **kwargs: keyword inputs of the module call.
        """
        hints, tr = _linen_init_trace(module, jax.random.key(0), args, kwargs, output)
        traced = _trace_or_warn(_linen_decisions, module, tr, args, kwargs, output)
        return cls(overrides, hints=hints, strict=strict, traced=traced)

    def check_overrides(self, paths: Sequence[str], where: str = "geometry") -> None:
        """Raise :class:`~spectral_optax.GeometryError` if a regex override matches none of ``paths``.

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
                + (getattr(e, "help", None) or _override_help(path, shape, suggested_axes(path, shape, shape_of)))
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
            e = self.explicit[path]
            if _is_dimension_numbers(e):
                return _from_dimension_numbers(e, path, shape), "dimension numbers"
            return _apply_override(e, path, shape), "explicit geometry tree"
        t = self._trace_for(path, shape)
        hint = self._from_hint(path, shape)
        if t is not None and t.geometry is not None:
            other, src = hint, "module hint"
            if other is None:
                src = "name rule"
                try:
                    with warnings.catch_warnings():  # a cross-check only: the trace decided
                        warnings.simplefilter("ignore", GeometryWarning)
                        other = _from_names(path, shape, shape_of, self._resolve_one)
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
            gave_up = t is not None and not t.defer  # the trace saw the leaf and could not decide it
            if (t is None or gave_up) and lay is not None and lay.doubt is not None:
                fix = (
                    f"the trace could not decide it ({t.reason}): fix it with an override"
                    if gave_up and t is not None
                    else "Pass example inputs so that the trace decides (spectral_optax.GeometryMap.from_nnx("
                    "model, x) / from_linen(model, x)), or fix it with an override"
                )
                warnings.warn(
                    f"parameter '{path}' with shape {shape}: taken as {_short(hint)} from its module, but "
                    f"{lay.doubt}. {fix[0].upper() + fix[1:]}.\n" + _override_help(path, shape),
                    GeometryWarning,
                    stacklevel=4,
                )
                if gave_up and t is not None:
                    return hint, f"module hint (warned; trace: {t.reason})"
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
        stacked = self._stacked(shape_of).get(path)
        if stacked is not None:
            return _stacked_by_names(path, shape, shape_of, stacked)
        g = _from_names(path, shape, shape_of, self._resolve_one)
        if head is not None and g.role == "output" and not _is_output_path(path):
            _default_head_warning(path, shape, head)
            return g, f"name rule, guessed read-out ({head})"
        return g, "name rule" + (f" (trace: {t.reason})" if t is not None else "")

    def _stacked(self, shape_of) -> dict[str, tuple[str, int]]:
        """:func:`~spectral_optax._geometry.stacked.stacked_groups` of the tree ``shape_of`` (cached)."""
        key = id(shape_of)
        if key not in self._stack_cache or self._stack_cache[key][0] is not shape_of:
            self._stack_cache[key] = (shape_of, stacked_groups(shape_of))
        return self._stack_cache[key][1]

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

    # -- user-facing ---------------------------------------------------------
    def tree(self, params) -> Any:
        """A tree of :class:`~spectral_optax.Geometry` with the structure of ``params``."""
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        paths = [path_str(p) for p, _ in flat]
        geoms = self.resolve(paths, [tuple(np.shape(x)) for _, x in flat])
        return jax.tree_util.tree_unflatten(treedef, list(geoms))

    def leaves(self, tree) -> list[tuple[str, Geometry]]:
        flat = _leaves_with_paths(tree)
        geoms = self.resolve([p for p, _ in flat], [tuple(np.shape(x)) for _, x in flat])
        return [(p, g) for (p, _), g in zip(flat, geoms)]


def _stacked_by_names(path: str, shape: tuple[int, ...], shape_of, stacked: tuple[str, int]) -> tuple[Geometry, str]:
    """A leaf of a block stacked on axis ``a`` (:mod:`~spectral_optax._geometry.stacked`): the name rules
    on the block's shapes without axis ``a``, then ``a`` put back as a batch axis."""
    block, a = stacked
    sub_of = {p: (drop_axis(s, a) if p.startswith(block + "/") else s) for p, s in shape_of.items()}

    def by_names(p, s, so):
        return _from_names(p, s, so, by_names)

    try:
        with warnings.catch_warnings():  # the name rules' own suggestions count axes without the layer axis
            warnings.simplefilter("ignore", GeometryWarning)
            g = by_names(path, drop_axis(shape, a), sub_of)
    except UndecidableGeometryError:
        err = UndecidableGeometryError(
            f"cannot infer the geometry of parameter '{path}' with shape {shape}: axis {a} is the layer axis "
            f"that every parameter of '{block}' shares (a batch axis), and no naming rule decides the others."
        )
        err.help = (  # type: ignore[attr-defined]
            f"(axis {a} is the layer axis of '{block}': a batch axis). "
            + _override_help(path, shape, suggested_axes(path, shape, shape_of))
        )
        raise err from None
    g = Geometry(shape, g.kind, insert_axis(g.fan_in_axes, a), insert_axis(g.fan_out_axes, a), g.fan_out_splits, g.role)
    return g, f"name rule, axis {a} the layer axis of '{block}'"


def _is_dimension_numbers(x) -> bool:
    """An ``optax.contrib.MuonDimensionNumbers`` (or a class with its fields, as MaxText's own)."""
    return hasattr(x, "reduction_axis") and hasattr(x, "output_axis") and not isinstance(x, type)


def _from_dimension_numbers(dn, path: str, shape: tuple[int, ...]) -> Geometry:
    """The matrix geometry that Muon dimension numbers state: the reduction axes fan-in, the output axes
    fan-out, every other axis a batch axis (optax's meaning)."""
    as_tuple = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,)  # noqa: E731
    red, out = as_tuple(dn.reduction_axis), as_tuple(dn.output_axis)
    try:
        if any(not -len(shape) <= a < len(shape) for a in red + out):
            raise GeometryError(f"reduction_axis={red}, output_axis={out} are not axes of a {len(shape)}-D array")
        return Geometry(shape, "matrix", red, out)
    except GeometryError as e:
        raise GeometryError(f"Muon dimension numbers for parameter '{path}' {shape}: {e}") from e


def _axes_of(g: Geometry) -> tuple:
    """What two geometries must share to place the same axes (the role aside)."""
    return (g.kind, g.fan_in_axes, g.fan_out_axes, g.fan_out_splits)


def _short(g: Geometry) -> str:
    """``matrix in(0,) out(1,) x3`` : a geometry in a few characters, for describe()."""
    if g.kind in ("vector", ELEMENTWISE):
        return g.kind
    split = f" x{g.fan_out_splits}" if g.fan_out_splits > 1 else ""
    return f"{g.kind} in{g.fan_in_axes} out{g.fan_out_axes}{split}"


GeometryLike = Any  # None | GeometryMap | Mapping[str, Override] | tree of Geometry | nnx.Module


def as_geometry_map(geometry: GeometryLike = None) -> GeometryMap:
    """Normalise every accepted ``geometry=`` argument into a :class:`~spectral_optax.GeometryMap`.

    Accepts ``None`` (infer from names), a :class:`~spectral_optax.GeometryMap`, a dict
    ``{regex: override}``, a tree whose leaves are :class:`~spectral_optax.Geometry` or
    Muon dimension numbers (``optax.contrib.MuonDimensionNumbers``, as optax's and MaxText's
    ``muon_weight_dimension_numbers``: reduction axes fan-in, output axes fan-out, the others batch;
    a ``None`` leaf leaves the parameter to the other rules), matched by path, or a live
    ``flax.nnx.Module``. Leaves that no rule decides fall
    back to ``'elementwise'`` with a warning; use ``GeometryMap(..., strict=True)``
    to raise instead.

    Args:
      geometry: any of the forms above.

    Returns:
      A :class:`~spectral_optax.GeometryMap` (the argument itself when it is one).
    """
    if geometry is None:
        return GeometryMap()
    if isinstance(geometry, GeometryMap):
        return geometry
    if _is_nnx_module(geometry):
        return GeometryMap.from_nnx(geometry)
    if isinstance(geometry, Mapping) and _looks_like_regex_dict(geometry):
        return GeometryMap(geometry)
    return GeometryMap(tree=geometry)


def init_with_geometry(module, rngs, *args, output=None, overrides=None, strict: bool = False, **kwargs):
    """``module.init(rngs, *args, **kwargs)`` and its :class:`~spectral_optax.GeometryMap`, from one trace.

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
      output, overrides, strict: as in :meth:`GeometryMap.from_apply` (what the loss reads;
        ``{regex: override}`` applied first; raise on undecided leaves).
      **kwargs: keyword inputs of the module call.

    Returns:
      ``(variables, geometry)``: the variables dict (``{'params': ..., ...}``)
      and the :class:`~spectral_optax.GeometryMap` to pass as ``geometry=``.
    """
    hints, tr = _linen_init_trace(module, rngs, args, kwargs, output)
    traced = _trace_or_warn(_linen_decisions, module, tr, args, kwargs, output)
    params, rest = tr.values()
    return {"params": params, **rest}, GeometryMap(overrides, hints=hints, strict=strict, traced=traced)


def infer_geometry(params, geometry: GeometryLike = None) -> Any:
    """The geometry tree of ``params`` (same structure, :class:`~spectral_optax.Geometry` leaves).

    Args:
      params: a Linen param dict, an ``nnx.State`` or any pytree of arrays.
      geometry: overrides; see :func:`~spectral_optax.as_geometry_map`.
    """
    return as_geometry_map(geometry).tree(params)
