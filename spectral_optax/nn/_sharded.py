"""Embedding lookups and parameter reads of the package's models on meshes with Explicit axes.

On a mesh whose axes are ``AxisType.Explicit`` every operation's output sharding must follow from
its inputs' shardings. Two places in a model do not: a row gather ``table[ids]`` from a table
sharded over its rows (the rows a device needs live on other devices), and a matmul whose
contracting dimensions are sharded (tensor parallelism on a row-parallel kernel, or an activation
sharded along the features meeting a kernel sharded on its fan-in). The package's models resolve
both the FSDP way, with the same function as on one device:

* :func:`take_rows` gathers ``table[ids]`` with the output sharded like ``ids`` on its leading
  dimensions and replicated along the features (``out_sharding`` of the gather; XLA moves the
  rows);
* :func:`gathered` wraps a Linen module (and :func:`gathered_call` calls an NNX module) so that,
  on an Explicit mesh, each parameter it reads is resharded to replicated before use (an
  all-gather in the forward pass, a reduce-scatter of its gradient back to the parameter's own
  sharding in the backward pass). Inside ``nn.scan`` / ``nnx.scan`` a block gathers one layer's
  parameters at a time.

Activations are then sharded along their batch dimensions only (as the token ids are), and every
matmul, norm and attention product has one unambiguous output sharding. On Auto meshes and off a
mesh both are the identity (XLA's propagation chooses the layouts).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P


def _explicit(x) -> bool:
    """True when ``x``'s type carries a sharding over a mesh with an Explicit axis."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    return bool(mesh is not None and not mesh.empty and mesh.explicit_axes)


def _is_sharded(x) -> bool:
    return _explicit(x) and any(entry is not None for entry in jax.typeof(x).sharding.spec)


def rows_sharding(table, ids) -> P | None:
    """The sharding of ``table[ids]`` on an Explicit mesh: ``ids``' spec, then the features
    replicated (``None`` off an Explicit mesh, where the gather needs none)."""
    if not (_explicit(table) or _explicit(ids)):
        return None
    spec = tuple(jax.typeof(ids).sharding.spec) if _explicit(ids) else ()
    spec = spec + (None,) * (jnp.ndim(ids) - len(spec))
    return P(*spec, None)


def take_rows(table, ids):
    """``table[ids]`` along axis 0 (``jnp.take`` semantics: out-of-range ids give NaN rows).

    On an Explicit mesh the gather's ``out_sharding`` is :func:`rows_sharding` (ids' layout, features
    replicated), so a table sharded over its rows or its features is read without a sharding error.
    """
    out = rows_sharding(table, ids)
    if out is None:
        return jnp.take(table, ids, axis=0)
    return table.at[ids].get(mode="fill", fill_value=jnp.nan, out_sharding=out)


def replicate(tree):
    """Every leaf sharded on an Explicit mesh resharded to replicated; other leaves as they are."""
    return jax.tree.map(lambda x: jax.sharding.reshard(x, P()) if _is_sharded(x) else x, tree)


def gathered(module_cls: Any) -> Any:
    """``module_cls`` whose parameter reads go through :func:`replicate` (same parameter paths)."""
    return nn.map_variables(module_cls, "params", trans_in_fn=replicate, mutable=True)


def gathered_call(module: Any, *args):
    """``module(*args)`` for an NNX module, its parameters read replicated on an Explicit mesh (each
    ``nnx.Param`` holds the resharded value during the call and its own array after it; sown
    intermediates stay in ``module``)."""
    params = [v for _, v in nnx.iter_graph(module) if isinstance(v, nnx.Param)]
    saved = [v.get_value() for v in params]
    if not any(_is_sharded(x) for x in saved):
        return module(*args)
    try:
        for v, x in zip(params, saved):
            v.set_value(replicate(x))
        return module(*args)
    finally:
        for v, x in zip(params, saved):
            v.set_value(x)


class Embed(nn.Embed):
    """``nn.Embed`` (same parameter, ``embedding``, and function) whose lookup also works on a mesh with
    Explicit axes: the rows come back sharded like the ids, features replicated (the gather's
    ``out_sharding``; XLA moves the rows). Off a mesh and on Auto meshes it is ``nn.Embed``."""

    def __call__(self, inputs):
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError(f"{self.name}: Embed inputs must be integers, got dtype {inputs.dtype}")
        (embedding,) = self.promote_dtype(self.embedding, dtype=self.dtype, inexact=False)
        if self.num_embeddings == 1:
            return jnp.broadcast_to(embedding, inputs.shape + (self.features,))
        return take_rows(embedding, inputs)
