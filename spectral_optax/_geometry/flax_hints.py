"""Flax glue: layout hints read from Linen / NNX modules, and the traces of their calls.

A module's type and attributes give the natural layout of its weights
(:func:`_module_layouts`): ``Dense`` / ``Linear`` / ``ConvLocal`` kernels
``(in, out)``, ``DenseGeneral`` ``(*in_axes, *out_axes)``, ``Conv`` ``(*window,
in, out)``, ``Embed`` ``(vocab, features)``, ``Einsum`` by its equation, norms'
scales and biases; extra leading axes are batch (stacked) axes. Linen hints are
recorded while the module runs (``nn.intercept_methods``), NNX hints are read
off the live module graph.

This is the geometry package's only module that imports Flax, and it does so
inside the functions, so that ``import spectral_optax`` does not load Flax.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from spectral_optax._geometry.trace import InitTrace, TraceDecision, trace_geometry, trace_init
from spectral_optax._geometry.types import GeometryWarning, _leaves_with_paths


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


#: The module attributes that :func:`_module_layouts` reads.
_MODULE_ATTRS = ("in_features", "out_features", "axis", "features", "kernel_size", "einsum_str")


def _attrs_of(module) -> dict[str, Any]:
    """The :data:`_MODULE_ATTRS` a module has set (static values only)."""
    out = {}
    for a in _MODULE_ATTRS:
        try:
            v = getattr(module, a)
        except Exception:  # noqa: BLE001 - unbound Linen attributes may raise
            continue
        if v is not None and not callable(v) and not isinstance(v, (jax.Array, np.ndarray)):
            out[a] = v
    return out


# --------------------------------------------------------------------------
# NNX.
# --------------------------------------------------------------------------
def _is_nnx_module(x) -> bool:
    """Whether ``x`` is a live ``flax.nnx.Module``."""
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, nnx.Module)


def _hints_from_nnx(module) -> dict[tuple[str, ...], dict[str, _Layout]]:
    """The layout hints of every submodule of a live NNX module, by module path."""
    from flax import nnx

    hints = {}
    for path, node in nnx.graph.iter_graph(module):
        if isinstance(node, nnx.Module):
            lay = _module_layouts(type(node).__name__, _attrs_of(node))
            if lay:
                hints[tuple(str(p) for p in path)] = lay
    return hints


def _nnx_param_paths(module) -> list[str]:
    """The '/'-joined paths of an NNX module's ``nnx.Param`` leaves."""
    from flax import nnx

    return [p for p, _ in _leaves_with_paths(nnx.state(module, nnx.Param))]


def _nnx_apply(module) -> tuple[Callable, Any]:
    """``(apply, params)``: ``apply(params, *args, **kwargs)`` calls ``module`` with its
    ``nnx.Param`` state replaced by ``params``; ``params`` is the module's own."""
    from flax import nnx

    parts: Any = nnx.split(module, nnx.Param, ...)
    graphdef, state, rest = parts

    def apply(p, *a, **kw):
        return nnx.merge(graphdef, p, rest)(*a, **kw)

    return apply, state


# --------------------------------------------------------------------------
# Linen.
# --------------------------------------------------------------------------
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


def _linen_init_trace(module, rngs, args, kwargs, output=None) -> tuple[dict, InitTrace]:
    """One ``jax.jit`` trace of ``module.init(rngs, *args, **kwargs)``, hints recorded: ``(hints, InitTrace)``."""
    import flax.linen as nn

    def init(r, *a, **kw):
        y, variables = module.init_with_output(r, *a, **kw)
        variables = dict(variables)
        params = variables.pop("params", {})
        return y, params, variables

    hints, interceptor = _linen_hint_recorder()
    with nn.intercept_methods(interceptor):
        tr = trace_init(init, rngs, *args, output=output, **kwargs)
    return hints, tr


def _linen_apply_trace(module, variables, args, kwargs, output=None) -> dict[str, TraceDecision]:
    """The decisions of a trace of ``module.apply`` on ``variables`` (arrays or shapes)."""
    others = [c for c in variables if c != "params"]

    def apply(p, collections, *a, **kw):
        out = module.apply(
            {**collections, "params": p}, *a, rngs={"dropout": jax.random.key(0)}, mutable=others or False, **kw
        )
        return out[0] if others else out  # the model's output, not the updated batch statistics

    rest = {c: variables[c] for c in others}
    return trace_geometry(apply, variables.get("params", {}), rest, *args, output=output, **kwargs)


def _linen_decisions(module, tr: InitTrace, args, kwargs, output=None) -> dict[str, TraceDecision]:
    """The init trace's decisions; the parameters it cannot place come from a trace of ``apply``."""
    traced = dict(tr.decisions())
    if tr.unmapped:
        params, rest = tr.traced.out_info  # shapes only
        with warnings.catch_warnings():  # the init trace warned about the returned value already
            warnings.simplefilter("ignore", GeometryWarning)
            applied = _linen_apply_trace(module, {"params": params, **rest}, args, kwargs, output)
        traced.update({p: applied[p] for p in tr.unmapped if p in applied})
    return traced
