"""The read-out multiplier of a tied embedding table (Parametrization 1).

A tied table ``E`` (``(vocab, d)``) is read twice: as a lookup ``h0 = E[token]``
and as the read-out ``logits = h @ E^T`` (Flax's ``Embed.attend``). The lookup's
spectral condition (one-hot input, ``n_in = 1``) wants Theta(1) entries, which
:func:`~spectral_optax.initializers.reinitialize` draws (``N(0, 1)``). With those
entries and Theta(1) features ``h``, ``h @ E^T`` has entries of size
``sqrt(d)`` at init (independent) and ``d`` once ``h`` aligns with ``E``, so
the logits, and the initial loss, grow with the width. The read-out needs
``||E^T||_* = Theta(sqrt(vocab / d))``, i.e. a factor ``1/d`` on the product
relative to Theta(1) entries: muP puts it in the forward pass as an output
multiplier (microsoft/mup's ``MuSharedReadout``, ``output_mult / width``).

:func:`tied_readout` applies that multiplier to a Linen model the user cannot
edit: inside the context, every ``flax.linen.Embed.attend`` returns its logits
times ``multiplier``. :func:`tied_readout_nnx` does the same to a live
``flax.nnx`` model, in place and for good (it survives ``nnx.split`` /
``merge`` and ``nnx.jit``). :func:`tied_readout_multiplier` gives the
multiplier ``base_width / d`` from the table's geometry. docs/math.md
("Tied embeddings") states the derivation.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

from spectral_optax._geometry import GeometryLike, as_geometry_map

__all__ = ["tied_readout", "tied_readout_multiplier", "tied_readout_nnx"]


def tied_readout_multiplier(params, geometry: GeometryLike = None, *, base_width: float = 1.0) -> float:
    """``base_width / d`` for the tied table of ``params`` (``d``: its fan-out size, the model width).

    The tied table is the leaf whose geometry is ``kind='embedding'`` with
    ``role='output'`` (the trace of :meth:`~spectral_optax.GeometryMap.from_linen`
    marks it so).

    Args:
      params: the parameter tree.
      geometry: see :func:`spectral_optax.as_geometry_map`; the trace of the model is what marks
        the tied read-out.
      base_width: the constant ``c`` of the multiplier ``c / d`` (muP's ``output_mult`` times the
        width at which it is 1): width-independent, tuned with the learning rate at the proxy and
        kept fixed when the width grows (starting values and a grid per optimizer: docs/guide.md,
        "A tied read-out"). The proxy's width makes the multiplier 1 at the proxy.

    Returns:
      The read-out multiplier ``base_width / d`` (a Python float).

    Raises:
      ValueError: no tied table, or several of different widths.
    """
    base_width = float(base_width)
    if not math.isfinite(base_width) or base_width <= 0:
        raise ValueError(f"tied_readout_multiplier: base_width must be a finite number > 0, got {base_width}")
    gmap = as_geometry_map(geometry)
    widths = {path: g.d_out for path, g in gmap.leaves(params) if g.kind == "embedding" and g.role == "output"}
    if not widths:
        raise ValueError(
            "tied_readout_multiplier: no tied embedding table (kind 'embedding', role 'output') in params; "
            "pass geometry=so.GeometryMap.from_linen(model, x) so that the trace marks the read-out, "
            "or leave an untied model as it is (its head is a matrix)."
        )
    if len(set(widths.values())) > 1:
        raise ValueError(
            f"tied_readout_multiplier: tied tables of different widths {widths}; pass one multiplier per model"
        )
    return base_width / next(iter(widths.values()))


@contextlib.contextmanager
def tied_readout(multiplier: float) -> Iterator[None]:
    """Within the context, ``flax.linen.Embed.attend`` returns ``multiplier * (query @ E^T)``.

    Use it around ``model.apply`` (training and evaluation alike), e.g.::

        m = so.initializers.tied_readout_multiplier(params, geometry)
        with so.initializers.tied_readout(m):
            logits = model.apply({'params': params}, x)

    The gradients that reach ``E`` through the read-out are scaled by the same
    factor (the chain rule), so the optimizers see the reparametrized model.

    Args:
      multiplier: the factor on the logits, a finite number > 0 (from
        :func:`tied_readout_multiplier`).
    """
    import flax.linen as nn

    multiplier = float(multiplier)
    if not math.isfinite(multiplier) or multiplier <= 0:
        raise ValueError(f"tied_readout: multiplier must be a finite number > 0, got {multiplier}")

    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if isinstance(context.module, nn.Embed) and context.method_name == "attend":
            return out * multiplier
        return out

    with nn.intercept_methods(interceptor):
        yield


_SCALED_NNX_EMBED: dict[type, type] = {}


def _scaled_nnx_embed(base: type) -> type:
    """The subclass of ``base`` (an ``nnx.Embed`` class) whose ``attend`` is times ``readout_multiplier``."""
    if base in _SCALED_NNX_EMBED.values():
        return base
    if base not in _SCALED_NNX_EMBED:

        def attend(self, query, *args, **kwargs):
            return base.attend(self, query, *args, **kwargs) * self.readout_multiplier

        attend.__doc__ = f"``readout_multiplier * {base.__name__}.attend(query)`` (see tied_readout_nnx)."
        _SCALED_NNX_EMBED[base] = type(f"ReadoutScaled{base.__name__}", (base,), {"attend": attend})
    return _SCALED_NNX_EMBED[base]


def tied_readout_nnx(model, multiplier: float):
    """Make every ``nnx.Embed`` of ``model`` return ``multiplier * (query @ E^T)`` from ``attend``, in place.

    The NNX counterpart of :func:`tied_readout`: the module objects keep
    their identity (a table shared by several parents stays shared) and
    their parameters (same paths, same values); each ``nnx.Embed`` becomes a
    subclass whose ``attend`` multiplies by the static attribute
    ``readout_multiplier``, so the factor travels with the model through
    ``nnx.split`` / ``nnx.merge``, ``nnx.jit`` and checkpoints of its state.
    The lookup ``embed(tokens)`` is unchanged. Calling it again sets (does not
    compound) the multiplier. Use it next to ``reinitialize``::

        geometry = so.GeometryMap.from_nnx(model, x)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, so.initializers.reinitialize(key, params, geometry))
        so.initializers.tied_readout_nnx(model, so.initializers.tied_readout_multiplier(params, geometry))

    Args:
      model: a live ``flax.nnx.Module``.
      multiplier: the factor on the logits, a finite number > 0 (from
        :func:`tied_readout_multiplier`).

    Returns:
      ``model`` (modified in place).

    Raises:
      ValueError: a bad multiplier, or no ``nnx.Embed`` in ``model`` (a read-out
        written by other code needs the factor in that code).
    """
    from flax import nnx

    multiplier = float(multiplier)
    if not math.isfinite(multiplier) or multiplier <= 0:
        raise ValueError(f"tied_readout_nnx: multiplier must be a finite number > 0, got {multiplier}")
    if not isinstance(model, nnx.Module):
        raise ValueError(
            f"tied_readout_nnx: model must be a live flax.nnx.Module, got {type(model).__name__}; "
            "for a Linen model use `with so.initializers.tied_readout(m): model.apply(...)`"
        )
    embeds = [node for _, node in nnx.iter_graph(model) if isinstance(node, nnx.Embed)]
    if not embeds:
        raise ValueError(
            f"tied_readout_nnx: no flax.nnx.Embed in {type(model).__name__}; a tied read-out computed by other "
            "code (e.g. `x @ table.T`) needs the factor `multiplier` in that code"
        )
    for node in {id(n): n for n in embeds}.values():
        node.__class__ = _scaled_nnx_embed(type(node))
        node.readout_multiplier = multiplier  # type: ignore[attr-defined]  # read by the subclass (static)
    return model
