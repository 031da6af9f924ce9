"""How sharding flows through the transforms (see docs/sharding.md).

Two regimes:

* **jit with sharded arrays** (``NamedSharding`` on an ``Auto`` or
  ``Explicit`` mesh, one or many hosts): every array carries its mesh in its
  type (``jax.typeof(x).sharding``), and on ``Explicit`` meshes its
  ``PartitionSpec`` too. Element-wise transforms and per-leaf reductions need
  nothing: XLA partitions them and inserts the collectives. Orthogonalization
  is the exception (a reduction over both matrix axes, repeated per
  Newton-Schulz step), so :func:`spectral_optax.orthogonalize_via_newton_schulz`
  distributes whole matrices over the devices (:func:`distribution_axes`).
* **inside** ``shard_map`` **or** ``pmap`` the arrays are per-device blocks
  and every transform sees its block only. Without ``axis_name`` a block is
  taken for the whole parameter (right for replicated, data-parallel
  parameters; a documented local-only behaviour). With ``axis_name`` (the
  ``in_specs`` of the parameters, or a mesh axis name for the FSDP layout
  ``P(name)``) every dual map gathers the blocks of each leaf along its
  sharded dimensions, computes on the whole parameter, and keeps its own
  block (:func:`gathered`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental.shard_alike import shard_alike
from jax.sharding import PartitionSpec as P

__all__ = [
    "AxisName",
    "aval_mesh",
    "axis_specs",
    "distribution_axes",
    "explicit_spec",
    "gathered",
    "replica_axes",
    "replica_groups",
]

#: What ``axis_name=`` accepts: a mesh axis name, a tuple of names, a
#: ``PartitionSpec`` or a tree of them (a prefix of the updates tree).
AxisName = Any


def _lower_shard_alike_inline() -> bool:
    """Make every ``shard_alike`` tie its own sharding group; ``True`` when done.

    JAX (0.10) lowers equal equations (one primitive, parameters and input types) once, as one
    function that each of them calls, and ``shard_alike``'s lowering draws its ``sdy.sharding_group``
    id (its GSPMD ``shard_group_id``) inside that function. Every tie of leaves of one shape and dtype
    (``shard_alike(update, gradient)`` per leaf) then carried one id: one group, so the partitioner
    gave all those leaves one layout (on an Auto mesh, same-shape gradients sharded ``P('data',
    None)``, ``P(None, 'data')`` and ``P()`` came back in one of them). Marked uncacheable, the
    primitive is lowered inline at each equation and each tie draws its own id. Process-wide (a
    lowering-time switch), and right for every caller of ``shard_alike``. Private JAX names: no
    public switch exists for one primitive (``tests/test_mesh_layout.py`` checks it is taken)."""
    try:
        from jax._src.interpreters import mlir as jax_mlir
        from jax._src.shard_alike import shard_alike_p
    except ImportError:  # pragma: no cover  (tests/test_mesh_layout.py fails on the supported JAX)
        return False
    uncacheable = getattr(jax_mlir, "_uncacheable_primitives", None)
    if not isinstance(uncacheable, set):  # pragma: no cover
        return False
    uncacheable.add(shard_alike_p)
    return True


#: Whether each ``shard_alike`` is lowered inline, as its own sharding group (:func:`_lower_shard_alike_inline`).
SHARD_ALIKE_INLINE = _lower_shard_alike_inline()


def aval_mesh(x):
    """The (abstract) mesh in ``x``'s type, or ``None`` (concrete arrays and tracers alike)."""
    try:
        sharding = jax.typeof(x).sharding
    except Exception:  # noqa: BLE001  (non-array leaves, old types; a ShapeDtypeStruct's own sharding)
        sharding = getattr(x, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not getattr(mesh, "axis_names", ()):
        return None
    return mesh


def _axis_types(mesh) -> dict[str, str]:
    types = getattr(mesh, "axis_types", None) or ()
    return {name: str(t).split(".")[-1] for name, t in zip(mesh.axis_names, types)}


def distribution_axes(mesh) -> tuple[str, ...]:
    """Mesh axes over which whole matrices can be spread: every non-manual axis of size > 1."""
    if mesh is None:
        return ()
    types = _axis_types(mesh)
    shape = dict(mesh.shape)
    return tuple(a for a in mesh.axis_names if types.get(a) != "Manual" and shape[a] > 1)


def manual_axes(mesh) -> tuple[str, ...]:
    """The ``Manual`` axes of size > 1 of ``mesh`` (inside ``shard_map``)."""
    types = _axis_types(mesh)
    shape = dict(mesh.shape)
    return tuple(a for a in mesh.axis_names if types.get(a) == "Manual" and shape[a] > 1)


def is_explicit(mesh, axes: Sequence[str]) -> bool:
    types = _axis_types(mesh)
    return any(types.get(a) == "Explicit" for a in axes)


def explicit_spec(x, ndim: int) -> P | None:
    """``x``'s ``PartitionSpec`` from its type (``Explicit`` axes only; ``None`` when unknown)."""
    try:
        sharding = jax.typeof(x).sharding
    except Exception:  # noqa: BLE001
        return None
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        return None
    names = [n for entry in spec for n in ((entry,) if isinstance(entry, str) else (entry or ()))]
    if not names or not is_explicit(mesh, names):
        return None
    return P(*tuple(spec) + (None,) * (ndim - len(spec)))


def spec_axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def on_auto_axes(fn: Callable, *args, num_outputs: int = 1):
    """``fn(*args)`` with every ``Explicit`` mesh axis of the arguments turned ``Auto``
    (``jax.sharding.auto_axes``), outputs replicated over them.

    For small results of contractions over sharded axes (power-iteration
    vectors), whose sharding ``Explicit`` types would otherwise ask for.
    """
    for x in jax.tree.leaves(args):
        mesh = aval_mesh(x)
        axes = tuple(a for a in distribution_axes(mesh) if is_explicit(mesh, (a,))) if mesh is not None else ()
        if axes:
            specs = P() if num_outputs == 1 else (P(),) * num_outputs
            with jax.sharding.use_abstract_mesh(mesh):
                return jax.sharding.auto_axes(fn, axes=axes, out_sharding=specs)(*args)
    return fn(*args)


def replicated_on_mesh_of(x, params):
    """``x`` (a small state array made in ``init``) replicated on the mesh of ``params``' shardings,
    so that the state ``init`` returns has the layout the update returns (``P()`` there); ``x``
    itself when the parameters are on no mesh (one device, ``shard_map`` / ``pmap`` blocks)."""
    for leaf in jax.tree.leaves(params):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding) and not isinstance(leaf, jax.core.Tracer):
            return jax.device_put(x, jax.sharding.NamedSharding(sharding.mesh, P()))
        mesh = aval_mesh(leaf)
        if mesh is not None and not mesh.empty and is_explicit(mesh, mesh.axis_names):
            return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, P()))
    return x


def keeping_layout(new, old_tree):
    """``new`` (the updates) with every array leaf traced under ``jit`` on an ``Auto`` mesh tied to
    the layout of the same leaf of ``old_tree`` (the gradients, ``shard_alike``): XLA's propagation
    would otherwise hand back a layout chosen for the update's own work (the plan's owners, a fused
    QKV's local cut). ``Explicit`` meshes
    (the layout is in the types) and ``Manual`` axes are left as they are. The optimizer state is
    not tied: on ``Auto`` meshes its layout is XLA's choice (docs/sharding.md)."""

    def keep(new, old):
        if not isinstance(new, jax.core.Tracer) or not isinstance(old, jax.core.Tracer):
            return new  # eager (nothing to propagate) or a constant
        if getattr(new, "shape", None) != getattr(old, "shape", None) or not getattr(new, "ndim", 0):
            return new
        mesh = aval_mesh(new)  # None under jit without a mesh context: Auto shardings are not in the types
        if mesh is not None and not mesh.empty and set(_axis_types(mesh).values()) != {"Auto"}:
            return new  # Explicit (in the types) or Manual (shard_map blocks)
        return shard_alike(new, old)[0]

    return jax.tree.map(keep, new, old_tree)


def blocks_local(x, g, devices: int):
    """``x`` (a leaf of geometry ``g``) constrained to be sharded over all ``devices`` on its largest
    batch or fan-in axis that they divide, when ``g`` fuses fan-out blocks (``fan_out_splits > 1``,
    QKV): cutting the fan-out into blocks (``to_matrix``) is then local. From a layout sharded on the
    fused fan-out (GPT-2 ``c_attn`` under FSDP) it is one all-to-all; left to XLA, the reshape
    replicates the leaf on every device."""
    if g.fan_out_splits == 1 or devices == 1:
        return x
    axes = [a for a in g.batch_axes + g.fan_in_axes if g.shape[a] % devices == 0]
    if not axes:
        return x
    spec: list = [None] * x.ndim
    spec[max(axes, key=lambda a: g.shape[a])] = "_devices"
    flat = device_view((devices,), ("_devices",))
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(flat, P(*spec)))


def keeping_specs(fn: Callable, leaves: Sequence[Any], mesh=None):
    """``fn(*leaves)`` (a tuple, one output per leaf); on a mesh with ``Explicit`` axes (of any
    size, one device included) under ``jax.sharding.auto_axes``, so that reshapes of sharded axes
    and contractions over them are XLA's to partition, each output in its leaf's ``PartitionSpec``.

    On a mesh of ``Auto`` axes only, each output is constrained to the leaves' mesh with every
    dimension unconstrained: ``fn`` may move the work to another view of the same devices (the
    plan's ``(_owners, _split)`` mesh), and an output whose type still named that view would have
    its propagated sharding (the leaf's own layout, through ``shard_alike``) read against the view
    when jit returns it, which fails where the layout's tiling does not fit the view (a 2-D
    ``P('data', 'model')`` layout against ``(_owners, _split) = (N, 1)``).

    ``mesh``: the leaves' mesh (default: the first one found in their types)."""
    if mesh is None:
        mesh = next((m for m in map(aval_mesh, leaves) if m is not None), None)
    explicit = tuple(a for a in mesh.axis_names if is_explicit(mesh, (a,))) if mesh is not None else ()
    if not explicit:
        out = fn(*leaves)
        if mesh is None or mesh.empty or "Manual" in _axis_types(mesh).values():
            return out
        free = lambda y: P(*[P.UNCONSTRAINED] * y.ndim)
        return tuple(jax.lax.with_sharding_constraint(y, jax.sharding.NamedSharding(mesh, free(y))) for y in out)
    specs = tuple(explicit_spec(x, x.ndim) or P() for x in leaves)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.sharding.auto_axes(fn, axes=explicit, out_sharding=specs)(*leaves)


# --------------------------------------------------------------------------
# shard_map / pmap: axis_name.
# --------------------------------------------------------------------------
def _as_spec(value) -> P | None:
    if value is None or isinstance(value, P):
        return value
    if isinstance(value, str):
        return P(value)
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return P(value)
    raise ValueError(
        f"axis_name must be a mesh axis name, a tuple of names, a PartitionSpec or a tree of "
        f"PartitionSpecs (a prefix of the updates), got {value!r}"
    )


def axis_specs(axis_name: AxisName, tree) -> list[P | None]:
    """One ``PartitionSpec`` (or ``None``) per leaf of ``tree`` from ``axis_name``.

    A name ``'data'`` or a tuple of names means ``P(names)`` for every leaf of
    at least one dimension (the FSDP layout, sharded along the first axis);
    a ``PartitionSpec`` applies to every leaf; a tree of them must be a
    prefix of ``tree`` (e.g. the ``in_specs`` given to ``shard_map``).
    """
    if not _is_tree(axis_name):
        spec = _as_spec(axis_name)
        return [spec if getattr(x, "ndim", 0) else None for x in jax.tree.leaves(tree)]
    return _broadcast_specs(axis_name, tree)


def _broadcast_specs(axis_name, tree) -> list[P | None]:
    is_spec = lambda s: s is None or isinstance(s, P)
    try:
        full = jax.tree.broadcast(axis_name, tree, is_leaf=is_spec)
    except ValueError as e:  # structure mismatch
        raise ValueError(
            "axis_name given as a tree must be a prefix of the updates tree (e.g. the in_specs of the "
            f"parameters given to shard_map): {e}"
        ) from None
    flat = jax.tree.leaves(full, is_leaf=is_spec)
    return [_as_spec(s) for s in flat]


def _gather(x, spec: P | None):
    if spec is None:
        return x
    for d, entry in enumerate(spec):
        names = spec_axes(entry)
        if names:
            x = jax.lax.all_gather(x, names if len(names) > 1 else names[0], axis=d, tiled=True)
    return x


def _keep_block(x, spec: P | None, local_shape):
    if spec is None:
        return x
    for d, entry in enumerate(spec):
        names = spec_axes(entry)
        if names:
            n = local_shape[d]
            idx = jax.lax.axis_index(names if len(names) > 1 else names[0])
            x = jax.lax.dynamic_slice_in_dim(x, idx * n, n, axis=d)
    return x


def gathered(update_fn: Callable, axis_name: AxisName) -> Callable:
    """Wrap a stateless ``update_fn(updates, state, params, **extra)`` for sharded blocks.

    Inside ``shard_map`` / ``pmap`` with ``axis_name``: every update leaf is
    all-gathered along its sharded dimensions (``jax.lax.all_gather(...,
    tiled=True)``), ``update_fn`` runs on whole parameters (so every norm,
    row/column reduction and Newton-Schulz iteration equals the unsharded
    one), and each device keeps its own block. ``axis_name=None`` returns
    ``update_fn`` unchanged (every block is taken for a whole parameter).
    """
    if axis_name is None:
        return update_fn
    if not _is_tree(axis_name):
        _as_spec(axis_name)  # validate at construction

    def wrapped(updates, state, params=None, **extra_args):
        flat, treedef = jax.tree_util.tree_flatten(updates)
        specs = axis_specs(axis_name, updates)
        if len(specs) != len(flat):
            raise ValueError(f"axis_name gives {len(specs)} specs for {len(flat)} update leaves")
        whole = [_gather(x, s) for x, s in zip(flat, specs)]
        out, state = update_fn(jax.tree_util.tree_unflatten(treedef, whole), state, params, **extra_args)
        out_flat = treedef.flatten_up_to(out)
        blocks = [_keep_block(y, s, x.shape) for y, s, x in zip(out_flat, specs, flat)]
        return jax.tree_util.tree_unflatten(treedef, blocks), state

    return wrapped


def _is_tree(value) -> bool:
    return not (
        value is None
        or isinstance(value, (str, P))
        or (isinstance(value, tuple) and all(isinstance(v, str) for v in value))
    )


def mesh_size(mesh, axes: Sequence[str]) -> int:
    shape = dict(mesh.shape)
    return int(math.prod(shape[a] for a in axes))


def context_mesh(mesh):
    """The context mesh when one is set (inside :func:`~spectral_optax._mesh.layout.keeping_specs`
    its axes are ``Auto``), else ``mesh`` (the leaves' own), for ``shard_map``."""
    context = jax.sharding.get_abstract_mesh()
    return mesh if context.empty else context


def mesh_order(mesh, axes) -> tuple[str, ...]:
    """``axes`` in the order of ``mesh``'s axes (the devices' order over them)."""
    return tuple(a for a in context_mesh(mesh).axis_names if a in axes)


#: The replica groups the distributed orthogonalization is traced within (:func:`replica_groups`).
_REPLICAS: list[int] = [1]


@contextlib.contextmanager
def replica_groups(count: int):
    """While tracing the distributed orthogonalization on a mesh whose leading axes replicate every
    parameter (:func:`replica_axes`): every view of the devices (:func:`device_view`) gets a leading
    ``'_replica'`` axis of ``count`` groups, so the plan's moves and Gram sums stay within each group."""
    _REPLICAS.append(int(count))
    try:
        yield
    finally:
        _REPLICAS.pop()


def replica_count() -> int:
    """The replica groups of :func:`replica_groups` (1 outside it)."""
    return _REPLICAS[-1]


def device_view(shape: Sequence[int], names: Sequence[str]):
    """An ``Auto`` ``AbstractMesh`` of the devices of one replica group viewed as ``shape`` (axes
    ``names``), led by ``('_replica', R)`` inside :func:`replica_groups` with ``R > 1`` (the
    replica axes lead the leaves' mesh, so the flat device order matches)."""
    r = replica_count()
    shape, names = ((r, *shape), ("_replica", *names)) if r > 1 else (tuple(shape), tuple(names))
    return jax.sharding.AbstractMesh(tuple(shape), tuple(names), axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def replica_axes(mesh, axes: Sequence[str], specs: Sequence[Any]) -> tuple[str, ...]:
    """The leading axes of ``mesh`` among ``axes`` that no spec of ``specs`` names, when every spec is
    known (``Explicit`` meshes): parameters are replicated over them (the replica axis of multi-slice
    training, whose links are the slow ones), so the orthogonalization runs within each replica group
    (docs/sharding.md, "3-D meshes"). A leaf without a spec is replicated where every axis of ``axes``
    is ``Explicit`` (its layout is in its type), else unknown. Empty when a spec is unknown or none
    names an axis."""
    if mesh is None or not axes:
        return ()
    types = _axis_types(mesh)
    if any(sp is None for sp in specs) and any(types.get(a) != "Explicit" for a in axes):
        return ()
    named = {a for sp in specs if sp is not None for entry in sp for a in spec_axes(entry)}
    if not named & set(axes):
        return ()
    lead = []
    for a in mesh.axis_names:
        if a in named:
            break
        if a in axes:
            lead.append(a)
    return tuple(lead)
