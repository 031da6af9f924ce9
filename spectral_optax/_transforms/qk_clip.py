"""QK-clip (MuonClip): per-head rescaling of query and key weights that caps the attention logits.

For an attention head ``h`` with query and key maps ``W_q^h, W_k^h`` (``d_in x d_h``
each) the pre-softmax logit of positions ``i, j`` is
``s_ij = (x_i W_q^h + b_q^h) . (x_j W_k^h + b_k^h) / sqrt(d_h)``. Given the largest
``S^h = max_ij |s_ij|`` of a step, :func:`~spectral_optax.qk_clip` multiplies ``W_q^h`` and ``W_k^h``
(and their biases) of the *new* parameters by ``sqrt(gamma_h)``,
``gamma_h = min(1, tau / S^h)``: the same inputs then give logits ``gamma_h s_ij``,
at most ``tau``. Heads with ``S^h <= tau`` are left exactly as the optimizer moved them.

Grouped-query attention (``K`` key heads, each shared by ``N / K`` query heads): query
head ``h`` is scaled by ``sqrt(gamma_h)`` and key head ``k`` by ``sqrt(min_{h in k} gamma_h)``,
so every logit of the group is again at most ``tau``.

Without logits (``source='bound'``), ``S^h`` is the weight-only bound
``||W_q^h W_k^h^T||_2 r^2 / sqrt(d_h)`` (inputs of norm at most ``r``, default
``sqrt(d_in)``: RMS-normalized inputs; biases ignored), computed on the ``d_h x d_h`` side
as ``||R_q R_k^T||_2`` with ``W^h = Q R`` (QR). See docs/math.md, "QK-clip".

Sharded parameters: the factor of an entry depends only on its layer and head, so it is built at
the size of the ``(L, N)`` logits (the kernel's fan-in axes of size 1) and broadcast against each
leaf in its own layout. On ``Explicit`` meshes the updates keep the parameters' shardings and, where
the heads have an axis of their own (or lead a flat fan-out axis), the logits' head sharding is kept,
so no collective is added; a flat fused ``(d, 3 N d_h)`` projection replicates the ``(L, N)``
factors first (one gather when the logits come sharded). Inside ``shard_map`` each device clips its
own heads with its own logits (a flat fused kernel must then not be split along its fan-out).

References:
  Kimi Team (2025), "Kimi K2: Open Agentic Intelligence", arXiv:2507.20534 (MuonClip).
  Su (2025), "QK-Clip: taking Muon one step further".
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spectral_optax._geometry import Geometry, GeometryLike, as_geometry_map, path_str, to_matrix
from spectral_optax._mesh.layout import aval_mesh, is_explicit, keeping_layout, on_auto_axes

__all__ = ["qk_clip", "attention_max_logits", "collect_max_logits", "qk_logit_bound", "AttentionSpec"]

#: The name under which attention modules record their per-head max logits.
MAX_LOGITS = "max_logits"

_QUERY = ("query", "q_proj", "q", "wq", "q_einsum")
_KEY = ("key", "k_proj", "k", "wk", "kv_einsum")
_FUSED = ("qkv", "qkv_proj", "c_attn", "wqkv", "qkv_einsum")
_STACKED = ("qkv_einsum", "kv_einsum")  # a leading stack axis (q/k/v or k/v) is a batch axis
_WEIGHT = ("kernel", "w")
_SOURCES = ("logits", "bound")


# --------------------------------------------------------------------------
# Recording the logits.
# --------------------------------------------------------------------------
def attention_max_logits(query: jax.Array, key: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Per-head ``max |q_i . k_j| / sqrt(d_h)`` over a batch: what :func:`~spectral_optax.qk_clip` reads.

    Args:
      query: ``(..., T, N, d_h)`` (Flax's layout: batch dims, length, heads, head dim).
      key: ``(..., S, K, d_h)`` with ``K`` dividing ``N`` (grouped-query attention:
        query head ``h`` reads key head ``h // (N / K)``).
      mask: optional, broadcastable to ``(..., N, T, S)`` (Flax's mask layout);
        ``False`` entries are excluded.

    Returns:
      ``(N,)`` float32: the largest absolute logit of each query head (max over the
      batch, positions and pairs: one max-reduction across data-parallel devices).
    """
    *batch, t, n, d = query.shape
    k_heads = key.shape[-2]
    if n % k_heads:
        raise ValueError(f"query heads {n} are not a multiple of key heads {k_heads}")
    q = query.astype(jnp.float32).reshape(*batch, t, k_heads, n // k_heads, d)
    s = jnp.einsum("...tkgd,...skd->...kgts", q, key.astype(jnp.float32)) / math.sqrt(d)
    s = jnp.abs(s).reshape(*batch, n, t, key.shape[-3])
    if mask is not None:
        s = jnp.where(jnp.broadcast_to(mask, s.shape), s, 0.0)
    return jnp.max(s, axis=tuple(range(len(batch))) + (-2, -1))


def collect_max_logits(intermediates: Any, name: str = MAX_LOGITS) -> dict[str, jax.Array]:
    """The per-head max logits recorded by attention modules, keyed by module path.

    Reads Linen ``intermediates`` (``model.apply(..., mutable=['intermediates'])``) or
    NNX state (``nnx.capture(model, nnx.Intermediate)``): every leaf under a key
    ``name`` is a value sown by the module above it. Several calls of one module
    (several sown values) give their elementwise max.

    Args:
      intermediates: the Linen ``intermediates`` collection (or the dict holding it) or an
        NNX ``State`` of ``nnx.Intermediate`` values.
      name: the sown name (default ``'max_logits'``, as the package's attention blocks use).

    Returns:
      ``{'blocks/attn': (layers..., N) array, ...}``: the ``max_logits=`` argument of
      :func:`~spectral_optax.qk_clip` (stacked layers, from ``nn.scan`` / ``nnx.scan``, lead).
    """
    if isinstance(intermediates, Mapping) and "intermediates" in intermediates:
        intermediates = intermediates["intermediates"]
    out: dict[str, jax.Array] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(intermediates)[0]:
        names = path_str(path).split("/")
        if name not in names:
            continue
        module = "/".join(names[: len(names) - 1 - names[::-1].index(name)])
        leaf = jnp.asarray(leaf)
        out[module] = leaf if module not in out else jnp.maximum(out[module], leaf)
    return out


# --------------------------------------------------------------------------
# Finding the query and key weights.
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """Where one attention's query and key weights are (for models the names do not tell).

    Attributes:
      query: path of the query kernel (``'blocks/attn/q_proj/kernel'``); for a fused
        projection the fused kernel, whose fan-out blocks are query, key, value.
      key: path of the key kernel (the same path for a fused projection; the stacked
        key/value kernel for ``kv_einsum``).
      num_heads: query heads ``N`` (default: from the kernel's two fan-out axes or the
        logits' last axis).
      num_kv_heads: key heads ``K`` (default: from the kernel, else ``N``).
      query_bias, key_bias: bias paths (default: the sibling ``bias`` leaf, if any;
        ``''``: none).
    """

    query: str
    key: str
    num_heads: int | None = None
    num_kv_heads: int | None = None
    query_bias: str | None = None
    key_bias: str | None = None


@dataclasses.dataclass(frozen=True)
class _Side:
    """One of query / key: a leaf viewed as ``(L, blocks, d_in, heads, d_h)``, block ``block``."""

    path: str
    geometry: Geometry
    blocks: int
    block: int
    heads: int
    bias: str | None


def _blocks_of(path: str, g: Geometry) -> int:
    if g.fan_out_splits > 1:
        return g.fan_out_splits
    parts = path.split("/")
    if len(parts) >= 2 and parts[-2] in _STACKED and g.batch_axes and g.batch_axes[-1] == len(g.shape) - 4:
        return g.shape[-4]
    return 1


def _fix(attn: str) -> str:
    return (
        f"pass attention={{'{attn}': so.AttentionSpec(query=..., key=..., num_heads=N, num_kv_heads=K)}} "
        "naming the query and key kernels and the head counts"
    )


def _side(attn, path, geoms, shapes, block_of_fused, heads, bias) -> _Side:
    if path not in geoms:
        raise ValueError(f"attention '{attn}': no parameter '{path}'; {_fix(attn)}")
    g = geoms[path]
    if g.kind != "matrix":
        raise ValueError(f"attention '{attn}': '{path}' has geometry kind {g.kind!r}, not a matrix; {_fix(attn)}")
    blocks = _blocks_of(path, g)
    block = block_of_fused if blocks > 1 else 0
    if blocks > 1 and blocks <= block:
        raise ValueError(f"attention '{attn}': '{path}' has {blocks} fused blocks, no block {block}; {_fix(attn)}")
    if len(g.fan_out_axes) == 2:
        axis_heads = g.shape[g.fan_out_axes[0]]
        if heads is not None and heads != axis_heads:
            raise ValueError(
                f"attention '{attn}': '{path}' has {axis_heads} heads on its fan-out axis, but {heads} were given "
                f"(or recorded in max_logits); {_fix(attn)}"
            )
        heads = axis_heads
    if heads is None or g.d_out % heads:
        raise ValueError(
            f"attention '{attn}': the head count of '{path}' (fan-out {g.d_out}) is not known"
            + ("" if heads is None else f" ({heads} does not divide it)")
            + f"; {_fix(attn)}"
        )
    if bias is None:
        sib = path.rsplit("/", 1)[0] + "/bias"
        bias = sib if sib in shapes else None
    elif bias == "":
        bias = None
    if bias is not None:
        size = int(np.prod(shapes[bias])) if bias in shapes else -1
        if size != g.num_slices // blocks * blocks * g.d_out:
            raise ValueError(
                f"attention '{attn}': bias '{bias}' (shape {shapes.get(bias)}) does not match the kernel "
                f"'{path}' ({g.shape}); pass query_bias= / key_bias= ('' for none) in an AttentionSpec"
            )
    return _Side(path, g, blocks, block, heads, bias)


def _module_of(parts: list[str]) -> str:
    return parts[-2] if len(parts) >= 2 else ""


def find_attention(params: Any, geometry: GeometryLike = None) -> dict[str, AttentionSpec]:
    """Attention modules recognised by their child names: ``{attention path: AttentionSpec}``.

    Split projections ``query``/``key`` (Flax), ``q_proj``/``k_proj``, ``q``/``k``, ``wq``/``wk``,
    Gemma's ``q_einsum``/``kv_einsum``; fused ``qkv``, ``qkv_proj``, ``c_attn``, ``wqkv``,
    ``qkv_einsum`` (kernel leaves ``kernel`` or ``w``).
    """
    del geometry
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    names = {path_str(p) for p in paths}
    found: dict[str, AttentionSpec] = {}
    for path in sorted(names):
        parts = path.split("/")
        if parts[-1] not in _WEIGHT or len(parts) < 2:
            continue
        attn, mod = "/".join(parts[:-2]), _module_of(parts)
        if mod in _FUSED:
            found[attn] = AttentionSpec(query=path, key=path)
        elif mod in _QUERY:
            for kname in _KEY:
                kp = "/".join(parts[:-2] + [kname, parts[-1]])
                if kp in names:
                    found[attn] = AttentionSpec(query=path, key=kp)
                    break
    return found


def _resolve(params, geometry, attention, logits_heads, num_heads=None) -> dict[str, tuple[_Side, _Side]]:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    shapes = {path_str(p): tuple(np.shape(x)) for p, x in flat}
    gmap = as_geometry_map(geometry)
    specs = dict(attention) if attention is not None else find_attention(params)
    wanted = {s.query for s in specs.values()} | {s.key for s in specs.values()}
    geoms = {p: g for p, g in gmap.leaves(params) if p in wanted}
    out = {}
    for attn, spec in specs.items():
        if isinstance(spec, Mapping):
            spec = AttentionSpec(**spec)
        nq = next((n for n in (spec.num_heads, logits_heads.get(attn), num_heads) if n is not None), None)
        q = _side(attn, spec.query, geoms, shapes, 0, nq, spec.query_bias)
        nk = spec.num_kv_heads
        if nk is None and not (len(geoms.get(spec.key, q.geometry).fan_out_axes) == 2 and spec.key != spec.query):
            nk = q.heads
        k = _side(attn, spec.key, geoms, shapes, 1 if spec.key == spec.query else 0, nk, spec.key_bias)
        if q.heads % k.heads or q.geometry.d_out // q.heads != k.geometry.d_out // k.heads:
            raise ValueError(
                f"attention '{attn}': {q.heads} query heads of width {q.geometry.d_out // q.heads} and "
                f"{k.heads} key heads of width {k.geometry.d_out // k.heads} do not pair up; {_fix(attn)}"
            )
        if q.geometry.num_slices // q.blocks != k.geometry.num_slices // k.blocks:
            raise ValueError(f"attention '{attn}': '{q.path}' and '{k.path}' have different layer stacks")
        out[attn] = (q, k)
    return out


def _layers(side: _Side) -> int:
    return side.geometry.num_slices // side.blocks


def _head_view(x, side: _Side) -> jax.Array:
    """``(L, heads, d_in, d_h)`` float32: the side's block of ``x``, one matrix per head."""
    g = side.geometry
    m = to_matrix(x.astype(jnp.float32), g).reshape(_layers(side), side.blocks, g.d_in, side.heads, -1)
    return jnp.moveaxis(m[:, side.block], 2, 1)


# --------------------------------------------------------------------------
# The weight-only bound.
# --------------------------------------------------------------------------
def _bound_per_head(params, q: _Side, k: _Side, leaves, input_norm) -> jax.Array:
    """``(L, N)``: ``||W_q^h W_k^h^T||_2 r^2 / sqrt(d_h)`` on the ``d_h x d_h`` side.

    A function of whole ``d_in x d_h`` head matrices: on an ``Explicit`` mesh it runs with the mesh
    axes ``Auto`` (XLA gathers what each head needs) and returns the bound replicated."""

    def bound(wq, wk):
        wq, wk = _head_view(wq, q), _head_view(wk, k)
        wk = jnp.repeat(wk, q.heads // k.heads, axis=1)
        rq = jnp.linalg.qr(wq, mode="r")  # (L, N, d_h, d_h) when d_in >= d_h
        rk = jnp.linalg.qr(wk, mode="r")
        return jnp.linalg.svd(rq @ jnp.swapaxes(rk, -1, -2), compute_uv=False)[..., 0]

    sigma = on_auto_axes(bound, leaves[q.path], leaves[k.path])
    r2 = float(q.geometry.d_in) if input_norm is None else jnp.asarray(input_norm, jnp.float32) ** 2
    return sigma * r2 / math.sqrt(q.geometry.d_out // q.heads)


def qk_logit_bound(
    params: Any,
    geometry: GeometryLike = None,
    *,
    attention: Mapping[str, Any] | None = None,
    num_heads: int | None = None,
    input_norm=None,
) -> dict[str, jax.Array]:
    """Per-head weight-only bound on the attention logits (no forward pass).

    ``|q_i . k_j| / sqrt(d_h) <= ||W_q^h W_k^h^T||_2 ||x_i|| ||x_j|| / sqrt(d_h)`` for bias-free
    projections; with ``||x|| <= input_norm`` (default ``sqrt(d_in)``: inputs of RMS 1, as a
    unit-scale LayerNorm / RMSNorm gives) it is ``||W_q^h W_k^h^T||_2 input_norm^2 / sqrt(d_h)``.
    The spectral norm is computed on the ``d_h x d_h`` side (``||R_q R_k^T||_2``, QR factors).

    Args:
      params: the parameter tree.
      geometry: see :func:`spectral_optax.as_geometry_map` (fan axes, fused splits, layer stacks).
      attention: ``{attention path: AttentionSpec or dict}`` where the names do not tell
        (default: found by name, see :class:`~spectral_optax.AttentionSpec`).
      num_heads: the query head count of every attention whose kernels do not show it (a fused
        ``(d, 3 d)`` kernel); an :class:`~spectral_optax.AttentionSpec` overrides it.
      input_norm: the bound ``r`` on the input norm (scalar).

    Returns:
      ``{attention path: (L, N) float32}`` (``L`` stacked layers, 1 if none; GQA: each query
      head with its key head).
    """
    sides = _resolve(params, geometry, attention, {}, num_heads)
    leaves = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    return {a: _bound_per_head(params, q, k, leaves, input_norm) for a, (q, k) in sides.items()}


# --------------------------------------------------------------------------
# The transform.
# --------------------------------------------------------------------------
def _mesh_spec(x):
    """``(mesh, spec)`` of ``x`` on a mesh with ``Explicit`` axes (the layout is in its type), else ``None``."""
    mesh = aval_mesh(x)
    if mesh is None or mesh.empty or not is_explicit(mesh, mesh.axis_names):
        return None
    spec = tuple(jax.typeof(x).sharding.spec)
    return mesh, spec + (None,) * (np.ndim(x) - len(spec))


def _reshard(x, layout, spec):
    return x if layout is None else jax.sharding.reshard(x, NamedSharding(layout[0], P(*spec)))


def _reshape(x, shape, layout, spec):
    """``x.reshape(shape)``; on an ``Explicit`` mesh (``layout``) with the output laid out as ``spec``."""
    shape = tuple(int(n) for n in shape)
    if layout is None:
        return x.reshape(shape)
    return jax.lax.reshape(x, shape, out_sharding=NamedSharding(layout[0], P(*spec)))


def _factor_leaf(u, side_scales: list[tuple[_Side, int, jax.Array]], is_bias: bool) -> jax.Array:
    """The per-entry factor of a kernel or bias leaf: ``scale`` on each (side, block) head, 1 elsewhere.

    ``side_scales``: ``(side, block, (L, heads))`` entries, all on this leaf. The factor has the
    leaf's axes with the fan-in axes of size 1 (it broadcasts against the leaf), so it is built from
    the ``(L, heads)`` scales without a kernel-sized array. On an ``Explicit`` mesh it is laid out as
    the leaf on its other axes: where the heads have an axis of their own (or lead a flat one), the
    scales' head sharding is kept through the reshapes, so scales sharded like the heads (or
    replicated) need no collective; the blocks of a fused flat projection (``(d, 3 N d_h)``) share
    one axis with the heads, so there the scales are replicated first (a gather of ``L x N``
    numbers when they come sharded)."""
    side = side_scales[0][0]
    g = side.geometry
    layers, blocks, heads = _layers(side), side.blocks, side.heads
    by_block = {block: scale for _, block, scale in side_scales}
    one = jnp.ones_like(side_scales[0][2])
    f = jnp.stack([by_block.get(b, one) for b in range(blocks)], axis=1)  # (L, blocks, heads)
    d_h = g.d_out // heads
    split = g.fan_out_splits
    fan_out = tuple(g.shape[a] for a in g.fan_out_axes)
    heads_lead = split == 1 and fan_out in ((heads, d_h), (heads * d_h,))
    if is_bias:
        heads_lead = heads_lead and blocks == 1 and tuple(u.shape[len(u.shape) - len(fan_out) :]) == fan_out
    layout = _mesh_spec(u)
    e_h = None
    if layout is not None:
        e_h = _mesh_spec(f)[1][-1] if heads_lead and _mesh_spec(f) is not None else None
        f = _reshard(f, layout, (None, None, e_h))
    f = jnp.broadcast_to(f[..., None], (layers, blocks, heads, d_h))
    if is_bias:
        spec = (None,) * (len(u.shape) - len(fan_out)) + (e_h,) + (None,) * (len(fan_out) - 1)
        return _reshard(_reshape(f, u.shape, layout, spec), layout, layout[1] if layout else ())
    shape1 = tuple(1 if a in g.fan_in_axes else n for a, n in enumerate(g.shape))
    perm = g.batch_axes + g.fan_in_axes + g.fan_out_axes
    if heads_lead:  # (L, blocks, heads, d_h) -> (batch axes..., fan-out axes...), heads kept on their axis
        batch = tuple(g.shape[a] for a in g.batch_axes)
        m = _reshape(f, batch + fan_out, layout, (None,) * len(batch) + (e_h,) + (None,) * (len(fan_out) - 1))
        m = jnp.expand_dims(m, tuple(range(len(batch), len(batch) + len(g.fan_in_axes))))
    else:  # from_matrix with d_in = 1: (batch, splits, 1, d_out) -> the permuted axes (scales replicated)
        m = f.reshape(g.num_slices // split, split, 1, g.d_out)
        if split > 1:
            m = jnp.swapaxes(m, 1, 2)
        m = m.reshape(tuple(shape1[a] for a in perm))
    if perm != tuple(range(len(perm))):
        m = jnp.transpose(m, [int(i) for i in np.argsort(perm)])
    if layout is None:
        return m
    return _reshard(m, layout, tuple(None if n == 1 else e for n, e in zip(shape1, layout[1])))


def _group_min(gamma: jax.Array, layers: int, k_heads: int) -> jax.Array:
    """``(L, K)``: the smallest ``gamma`` of each key head's group of query heads."""
    layout = _mesh_spec(gamma)
    if layout is not None and layout[1][-1] is not None:
        names = (layout[1][-1],) if isinstance(layout[1][-1], str) else tuple(layout[1][-1])
        shards = math.prod(dict(layout[0].shape)[a] for a in names)
        if k_heads % shards:  # the head axis cannot split into (K, N / K) along its shards
            gamma = _reshard(gamma, layout, (None,) * gamma.ndim)
    return jnp.min(gamma.reshape(layers, k_heads, -1), axis=-1)


def _clipped(u, p, factor):
    """``u`` where ``factor == 1`` (bit for bit); ``factor (p + u) - p`` elsewhere."""
    p32 = p.astype(jnp.float32)
    new = (p32 + u.astype(jnp.float32)) * factor
    return jnp.where(factor < 1, (new - p32).astype(u.dtype), u)


def qk_clip(
    threshold: float = 100.0,
    *,
    geometry: GeometryLike = None,
    attention: Mapping[str, Any] | None = None,
    source: str = "logits",
    num_heads: int | None = None,
    input_norm=None,
) -> optax.GradientTransformationExtraArgs:
    """QK-clip: rescale the query and key heads whose logits exceed ``threshold``.

    Chain it after any optimizer, last: ``optax.chain(so.muon(lr), so.qk_clip(100.0))`` (a
    transform after it that scales the updates, such as ``optax.scale_by_schedule``, would scale
    the clip as well). Its
    ``update(updates, state, params, max_logits=...)`` returns updates ``u'`` such that
    ``params + u'`` are the optimizer's new parameters ``params + updates`` with every head's
    ``W_q^h, W_k^h`` (and biases) multiplied by ``sqrt(gamma_h)``,
    ``gamma_h = min(1, threshold / S^h)`` (GQA key heads: the group's smallest ``gamma``).
    Heads with ``S^h <= threshold`` keep their updates bit for bit. The state is empty.

    Args:
      threshold: ``tau``, the largest logit allowed (positive).
      geometry: see :func:`spectral_optax.as_geometry_map`: it tells the fan-in / fan-out /
        layer axes and fused QKV blocks of the kernels.
      attention: ``{attention path: AttentionSpec or dict}`` for models whose names do not
        tell where the query and key kernels are (default: found by name).
      source: ``'logits'`` (``S^h`` = the ``max_logits`` argument, as
        :func:`~spectral_optax.collect_max_logits` returns it) or ``'bound'`` (``S^h`` = the weight-only bound
        :func:`~spectral_optax.diagnostics.qk_logit_bound` of the new parameters, for models that cannot report logits).
      num_heads: query heads of attentions whose kernels and logits do not show them
        (``source='bound'`` with a fused ``(d, 3 d)`` kernel).
      input_norm: the input-norm bound of ``source='bound'`` (default ``sqrt(d_in)``).

    Returns:
      An ``optax.GradientTransformationExtraArgs``; ``update`` needs ``params`` and, for
      ``source='logits'``, ``max_logits={attention path: (layers..., N)}`` (nested or flat).
    """
    threshold = float(threshold)
    if not math.isfinite(threshold) or threshold <= 0:
        raise ValueError(f"qk_clip: threshold must be a positive finite number, got {threshold}")
    if source not in _SOURCES:
        raise ValueError(f"qk_clip: source must be one of {_SOURCES}, got {source!r}")

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None, *, max_logits=None, **extra_args):
        del extra_args
        if params is None:
            raise ValueError("qk_clip needs params: call update(updates, state, params, max_logits=...)")
        logits: dict[str, jax.Array] = {}
        if source == "logits":
            if max_logits is None:
                raise ValueError(
                    "qk_clip(source='logits') needs max_logits=so.collect_max_logits(intermediates) in update(); "
                    "for a model that cannot report logits use qk_clip(..., source='bound')"
                )
            logits = {path_str(p): jnp.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(max_logits)[0]}
            logits = {re.sub(rf"/{MAX_LOGITS}(/\d+)?$", "", k): v for k, v in logits.items()}
        heads = {a: int(np.shape(v)[-1]) for a, v in logits.items() if np.ndim(v)}
        sides = _resolve(params, geometry, attention, heads, num_heads)
        if source == "logits":
            missing = sorted(set(logits) - set(sides))
            if missing:
                raise ValueError(
                    f"qk_clip: max_logits for '{missing[0]}', but no attention with query/key kernels there; "
                    f"{_fix(missing[0])}"
                )
            sides = {a: s for a, s in sides.items() if a in logits}
        flat_u, treedef = jax.tree_util.tree_flatten_with_path(updates)
        upaths = [path_str(p) for p, _ in flat_u]
        pleaves = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
        per_leaf: dict[str, list] = {}
        for attn, (q, k) in sides.items():
            layers = _layers(q)
            if source == "logits":
                s = jnp.asarray(logits[attn], jnp.float32)
                if s.size != layers * q.heads:
                    raise ValueError(
                        f"qk_clip: max_logits['{attn}'] has shape {s.shape}, the attention has {layers} layer(s) "
                        f"of {q.heads} query heads (expected (layers..., {q.heads}))"
                    )
                s = s.reshape(layers, q.heads)
            else:
                new = {
                    pth: pleaves[pth].astype(jnp.float32) + u.astype(jnp.float32)
                    for pth, (_, u) in zip(upaths, flat_u)
                    if pth in (q.path, k.path)
                }
                s = _bound_per_head(None, q, k, new, input_norm)
            gamma = jnp.where(s > threshold, threshold / jnp.where(s > threshold, s, 1.0), 1.0)
            if q.geometry.fan_out_splits > 1 or k.geometry.fan_out_splits > 1:  # flat fused q | k | v
                gamma = _reshard(gamma, _mesh_spec(gamma), (None, None))  # one gather, for kernel and bias
            gk = _group_min(gamma, layers, k.heads)
            for side, gm in ((q, gamma), (k, gk)):
                for leaf in (side.path, side.bias):
                    if leaf is not None:
                        per_leaf.setdefault(leaf, []).append((side, side.block, jnp.sqrt(gm)))
        out = []
        for pth, (_, u) in zip(upaths, flat_u):
            if pth in per_leaf:
                entries = per_leaf[pth]
                is_bias = entries[0][0].path != pth
                u = keeping_layout(_clipped(u, pleaves[pth], _factor_leaf(u, entries, is_bias)), u)
            out.append(u)
        return jax.tree_util.tree_unflatten(treedef, out), state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
