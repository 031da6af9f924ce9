"""A leaf tiled over several mesh axes moved to one axis of it, and back, one mesh axis at a time.

XLA's partitioner moves one mesh axis from one array axis to another by an all-to-all, but a move
between a tiling over two mesh axes and a one-axis layout on a third array axis (an expert stack
``P(None, 'data', 'model', None)`` on its way to ``P(None, None, None, ('data', 'model'))``, the
rows of its wide view) it does as "involuntary full rematerialization": the whole stack gathered on
every device. :func:`one_axis_steps` gives the layouts in between, each one mesh axis moved, so
that every step is an all-to-all (docs/lab_log.md, 2026-12-07 (10a)).
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from spectral_optax._geometry import Geometry
from spectral_optax._mesh.layout import context_mesh, spec_axes

__all__ = ["one_axis_steps", "through"]


def one_axis_steps(g: Geometry, spec, names: tuple[str, ...], devices: int) -> list[P]:
    """The specs from ``spec`` (a leaf's, naming two or more of the mesh axes ``names``, in the
    devices' order) to all of ``names`` on the one array axis that becomes the rows of the leaf's
    wide view (else its columns), each a move of one mesh axis: the major axis first, each next one
    appended as the minor part, so that the last spec's tiling is the devices' flat order. Empty
    when ``spec`` names fewer than two axes or names outside ``names``, when the leaf fuses
    fan-out blocks or has several fan-in / fan-out axes, when neither axis divides over the
    ``devices``, when each of them holds an axis out of that order (a minor mesh axis that a
    major one would have to pass), or when an array axis holds several mesh axes (moved as they
    are)."""
    if spec is None or g.fan_out_splits != 1 or len(g.fan_in_axes) != 1 or len(g.fan_out_axes) != 1:
        return []
    entries = [spec_axes(e) for e in spec] + [()] * (len(g.shape) - len(spec))
    named = [a for e in entries for a in e]
    if len(set(named)) < 2 or not set(named) <= set(names) or any(len(e) > 1 for e in entries):
        return []  # one mesh axis or none; or already one-axis layouts of several (moved as they are)
    rows, cols = (g.fan_out_axes[0], g.fan_in_axes[0]) if g.d_in > g.d_out else (g.fan_in_axes[0], g.fan_out_axes[0])
    prefix = lambda e: tuple(e) == tuple(names[: len(e)])
    target = next((t for t in (rows, cols) if g.shape[t] % devices == 0 and prefix(entries[t])), None)
    if target is None:
        return []
    steps, current = [], list(entries)
    for a in names[len(entries[target]) :]:
        current = [tuple(x for x in e if x != a) for e in current]
        current[target] = (*current[target], a)
        steps.append(P(*[e if len(e) > 1 else (e[0] if e else None) for e in current]))
    return steps


def through(x, specs, mesh):
    """``x`` constrained to each spec of ``specs`` in turn, on the context mesh (else ``mesh``)."""
    m = context_mesh(mesh)
    for sp in specs:
        x = jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(m, sp))
    return x
