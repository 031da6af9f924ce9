"""``describe(params)``: the geometry of every parameter, as a table.

One row per leaf: path, shape, kind (and role), ``d_in``, ``d_out``, batch
axes, the spectral condition's target norm ``sqrt(d_out / n_in)`` (``n_in``
= 1 for embeddings and vectors) and the Parametrization-1 learning-rate
multipliers for SGD (``d_out / n_in``) and Adam (``1 / n_in``), relative to
``base`` when given. A tied table (kind ``'embedding'``, role ``'output'``:
looked up and read out) gets a ``note``: the read-out multiplier ``1 / d`` its
forward pass needs (:func:`~spectral_optax.initializers.tied_readout`,
docs/math.md "Tied embeddings"), printed under the table.
"""

from __future__ import annotations

from typing import Any

from spectral_optax._geometry import GeometryLike, as_geometry_map
from spectral_optax._transforms.parametrization import relative_multipliers

_COLUMNS = ("path", "shape", "kind", "d_in", "d_out", "batch_axes", "target_norm", "lr_sgd", "lr_adam", "decided_by")


def describe(params: Any, geometry: GeometryLike = None, *, base: Any = None, print_table: bool = True):
    """Tabulate the geometry of ``params`` and return the rows.

    Args:
      params: a Linen param dict, an ``nnx.State`` or any pytree of arrays
        (or ``jax.ShapeDtypeStruct``).
      geometry: overrides or a model-derived map, see
        :func:`spectral_optax.as_geometry_map`.
      base: params (or shapes) at the base width: the LR multipliers are
        then relative to it.
      print_table: print the table.

    Returns:
      A list of dicts with keys ``path, shape, kind, role, d_in, d_out,
      batch_axes, num_slices, target_norm, lr_sgd, lr_adam, decided_by``;
      ``decided_by`` says how the leaf was decided: ``'override ...'``,
      ``'explicit geometry tree'``, ``'trace: ...'`` (from
      :meth:`~spectral_optax.GeometryMap.from_apply` or a traced
      ``from_linen`` / ``from_nnx``, with what a module hint or name rule said
      where it differed), ``'module hint'``, ``'name rule'`` or
      ``'fallback: element-wise'``; ``note``: ``''``, or for a tied table
      (looked up and read out) the read-out multiplier ``1 / d`` that
      Parametrization 1 needs in its forward pass and how to apply it
      (:func:`~spectral_optax.initializers.tied_readout` for Linen,
      :func:`~spectral_optax.initializers.tied_readout_nnx` for NNX); the
      table cannot see whether the model applies it, so the note is printed
      under the table whenever such a table is present.

    Raises:
      GeometryError: a leaf no rule covers; the message names it and shows
        the override that fixes it.
    """
    gmap = as_geometry_map(geometry)
    sgd = relative_multipliers(params, "sgd", base=base, geometry=gmap)
    adam = relative_multipliers(params, "adam", base=base, geometry=gmap)
    rows = []
    for path, g in gmap.leaves(params):
        rows.append(
            dict(
                path=path,
                shape=g.shape,
                kind=g.kind if g.role == "hidden" else f"{g.kind}/{g.role}",
                role=g.role,
                d_in=g.d_in,
                d_out=g.d_out,
                batch_axes=g.batch_axes,
                num_slices=g.num_slices,
                target_norm=g.target_spectral_norm,
                lr_sgd=sgd[path],
                lr_adam=adam[path],
                decided_by=gmap.decided_by(path, g.shape),
                note=_tied_note(path, g.d_out) if g.kind == "embedding" and g.role == "output" else "",
            )
        )
    if print_table:
        print(format_table(rows))
    return rows


def _tied_note(path: str, d: int) -> str:
    return (
        f"{path} is a tied table (looked up and read out): with Parametrization 1's N(0, 1) entries "
        f"(reinitialize) its read-out needs the factor c/d in the forward pass (c = 1: 1/d = {1.0 / d:.4g}; c is "
        "tied_readout_multiplier's base_width, a constant tuned at the proxy), or the logits "
        "grow like sqrt(d) and the initial loss with d "
        "(m = so.initializers.tied_readout_multiplier(params, geometry, base_width=c); Linen: "
        "`with so.initializers.tied_readout(m): model.apply(...)`; NNX: so.initializers.tied_readout_nnx(model, m)). "
        "describe cannot see whether the model applies it."
    )


def format_table(rows: list[dict]) -> str:
    """Render :func:`~spectral_optax.describe`'s rows as an aligned text table."""

    def cell(key, value):
        if key in ("target_norm", "lr_sgd", "lr_adam"):
            return f"{value:.4g}"
        if key == "batch_axes":
            return ",".join(map(str, value)) or "-"
        return str(value)

    table = [list(_COLUMNS)] + [[cell(k, r[k]) for k in _COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"note: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines)
