"""What every named optimizer is made of: a table of routes chosen by geometry.

A named optimizer is ``optax.partition(table, labels)`` (+ the shared decay
-> learning-rate tail of :mod:`spectral_optax._transforms.weight_decay`),
where ``table`` maps a route name to a transform built from the public
transforms and ``labels`` gives each parameter a route from its
:class:`~spectral_optax.Geometry` (kind and role), resolved once per tree
by the optimizer's single :class:`~spectral_optax.GeometryMap`.

The table is fixed at construction, so the optimizer state's structure
depends on the parameter tree only, never on which routes it happens to use:
``optax.tree_map_params`` and checkpoint restore see the same structure for
every model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from spectral_optax._geometry import Geometry, GeometryMap, label_by_geometry, path_str
from spectral_optax._mesh.layout import keeping_layout

__all__ = ["geometry_partition", "train_float_leaves"]


def geometry_partition(
    table: Mapping[str, optax.GradientTransformation],
    route_of: Callable[[str, Geometry], str],
    gmap: GeometryMap,
    *,
    split: Callable[[Any], Any] | None = None,
    check_paths: Callable[[list[str]], None] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """``optax.partition(table, labels)`` with labels from each leaf's geometry.

    Args:
      table: route name -> transform (fixed at construction).
      route_of: ``(path, geometry) -> route name``.
      gmap: the optimizer's geometry map (shared with the transforms in
        ``table``, so each tree is resolved once).
      split: optional ``params -> tree of bools``; a leaf whose value is
        False gets the route ``name + ':nodecay'`` (which must be in
        ``table``).
      check_paths: optional ``paths -> None`` called with every leaf's
        '/'-joined path (to reject per-path options that match nothing).
    """
    base = label_by_geometry(route_of, gmap)

    def labels(params):
        routes = base(params)
        if not jax.tree.leaves(params):  # an empty tree: tree_map_params' placeholder
            return routes
        if check_paths is not None:
            check_paths([path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]])
        if split is None:
            return routes
        keep = split(params)
        return jax.tree.map(lambda r, k: r if k else r + ":nodecay", routes, keep)

    return optax.partition(dict(table), labels)


def _zero_update() -> optax.GradientTransformationExtraArgs:
    """Updates of exactly zero in each parameter's own dtype (the parameter stays as it is)."""

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        if params is None:
            return jax.tree.map(jnp.zeros_like, updates), state
        return jax.tree.map(lambda u, p: jnp.zeros(jnp.shape(p), jnp.result_type(p)), updates, params), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def _trainable_labels(params, gmap: GeometryMap | None = None):
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    if gmap is not None and flat:  # (an empty tree is tree_map_params' placeholder)
        gmap.check_overrides([path_str(p) for p, _ in flat])
    labels = []
    for path, x in flat:
        if not hasattr(x, "dtype") or not hasattr(x, "shape"):
            raise TypeError(
                f"parameter '{path_str(path)}' is a {type(x).__name__}, not an array: the optimizer "
                "cannot update it in place. Store it as an array (jnp.asarray(value)) or keep it out "
                "of the parameter tree."
            )
        trainable = jnp.issubdtype(x.dtype, jnp.inexact) and x.size > 0
        labels.append("train" if trainable else "frozen")
    return jax.tree_util.tree_unflatten(treedef, labels)


def train_float_leaves(
    tx: optax.GradientTransformation, gmap: GeometryMap | None = None
) -> optax.GradientTransformationExtraArgs:
    """``tx`` on floating-point leaves with at least one entry; the others stay unchanged.

    The bad-value contract of every named optimizer: integer and boolean
    leaves (step counters, masks) and size-0 leaves get an update of exactly
    zero in their own dtype (``optax.apply_updates`` leaves them bit for bit
    as they are; ``tx`` never sees them, so no rule has to define a step for
    them); a leaf that is not an array (a Python float) is rejected with a
    ``TypeError`` naming its path. 0-d float leaves are trained (geometry
    kind ``'vector'``). With ``gmap``, a regex override of the optimizer's
    geometry that matches no parameter path is rejected (a
    :class:`~spectral_optax.GeometryError` listing the paths) the first time
    the tree is seen. On an ``Auto`` mesh the updates keep the gradients' layout
    (:func:`~spectral_optax._mesh.layout.keeping_layout`).
    """
    inner = optax.partition({"train": tx, "frozen": _zero_update()}, lambda params: _trainable_labels(params, gmap))

    def update_fn(updates, state, params=None, **extra_args):
        new_updates, new_state = inner.update(updates, state, params, **extra_args)
        return keeping_layout(new_updates, updates), new_state

    return optax.GradientTransformationExtraArgs(inner.init, update_fn)


def optax_aliases(**aliases: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Accept optax's argument names beside the optimizer's own: ``alias='own_name'``.

    ``muon(lr, beta=0.9)`` is ``muon(lr, momentum=0.9)``; passing both names is a
    ``TypeError`` naming both (unless the own name carries its default, as
    ``optax.inject_hyperparams`` passes every default: then the alias wins).
    The aliases appear in the signature (keyword-only, default ``None``: not
    given) and in a line of the docstring, so ``help``, ``inspect.signature``
    and ``optax.inject_hyperparams`` see them.
    """
    import functools
    import inspect

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        for alias, own in aliases.items():
            if own not in sig.parameters or alias in sig.parameters:
                raise AssertionError(f"{fn.__name__}: bad alias {alias} -> {own}")

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for alias, own in aliases.items():
                if alias not in kwargs:
                    continue
                value = kwargs.pop(alias)
                if value is None:
                    continue
                if own in kwargs and not _is_default(kwargs[own], sig.parameters[own].default):
                    raise TypeError(f"{fn.__name__}() got both {own!r} and its optax alias {alias!r}: pass one of them")
                kwargs[own] = value
            return fn(*args, **kwargs)

        extra = [inspect.Parameter(a, inspect.Parameter.KEYWORD_ONLY, default=None) for a in aliases]
        params = list(sig.parameters.values())
        tail = [p for p in params if p.kind == p.VAR_KEYWORD]
        head = [p for p in params if p.kind != p.VAR_KEYWORD]
        wrapper.__signature__ = sig.replace(parameters=head + extra + tail)  # type: ignore[attr-defined]
        wrapper.__doc__ = _document_aliases(fn.__doc__ or "", aliases)
        return wrapper

    return decorate


def _document_aliases(doc: str, aliases: dict[str, str]) -> str:
    """``doc`` with one ``Args:`` entry per alias, at the end of the section."""
    entries = "".join(f"      {a}: optax's name for ``{o}`` (an alias; not both).\n" for a, o in aliases.items())
    start = doc.find("    Args:\n")
    if start < 0:
        return doc + "\n    Args:\n" + entries
    end = doc.find("\n\n", start)
    end = len(doc) if end < 0 else end + 1
    return doc[:end] + entries + doc[end:]


def _is_default(value: Any, default: Any) -> bool:
    """``value`` is ``default``: the same object, an equal number (``optax.inject_hyperparams`` passes
    every numeric default as an array), or a traced value (its injected state under ``jit``)."""
    if value is default or isinstance(value, jax.core.Tracer):
        return True
    if not isinstance(default, (int, float)) or isinstance(default, bool):
        return False
    try:
        return bool(jnp.all(jnp.asarray(value) == default))
    except TypeError:
        return False
