"""``contrib_muon``: ``optax.contrib.muon``'s signature, state and update, on this package's engine.

``optax.contrib.muon`` is ``optax.partition`` of two routes: ``'muon'``, the
chain ``scale_by_muon -> scale_by_shape -> add_decayed_weights ->
scale_by_learning_rate`` on the leaves that have dimension numbers (every 2-D
leaf by default, read as ``(d_in, d_out)``), and ``'adam'``, ``optax.adamw``,
on the others. :func:`contrib_muon` builds the same partition with the same
labels, the same dimension-number resolution (a tree, a prefix tree with
``None`` for Adam leaves, or a callable) and a state of the same structure
(``state[0]['muon'][0][0]`` is contrib's own ``optax.contrib.MuonState``),
so a checkpoint of one restores into the other. What differs is who
orthogonalizes: each leaf's :class:`~optax.contrib.MuonDimensionNumbers`
becomes a :class:`~spectral_optax.Geometry` (reduction axes -> fan-in, output
axes -> fan-out, every other axis a batch axis), and
:func:`~spectral_optax.orthogonalize_via_newton_schulz` runs the iteration:
same-shape matrices batched, the Gram-space iteration where it saves flops,
the distributed plan on a mesh (docs/sharding.md).

References:
  Jordan et al. (2024), Muon; optax.contrib.muon (google-deepmind/optax,
  optax/contrib/_muon.py); Boissin et al. (2025), Turbo-Muon (AOL);
  Grishina et al. (2025) (Schatten-4); Ahn et al. (2025), Dion (its table).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, MuonState

from spectral_optax._geometry import Geometry, GeometryMap, path_str
from spectral_optax._mesh.layout import keeping_layout, replicated_on_mesh_of
from spectral_optax._transforms.momentum import debiased_momentum
from spectral_optax._transforms.orthogonalize import orthogonalize_via_newton_schulz

__all__ = ["CONTRIB_NS_COEFFS", "contrib_muon"]

#: ``optax.contrib.muon``'s ``ns_coeffs`` presets: ``'standard'`` (Muon's quintic, the default), ``'dion'``.
CONTRIB_NS_COEFFS = {
    "standard": (3.4445, -4.7750, 2.0315),
    "dion": (
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ),
}
_PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")
_AOL_EPS = 1e-8  # contrib's floor on the AOL row sums and the Schatten-4 norm (not its ``eps`` argument)


def _is_dims(x) -> bool:
    return isinstance(x, MuonDimensionNumbers)


def _axes(ndim: int, dims: MuonDimensionNumbers) -> tuple[tuple[int, ...], tuple[int, ...]]:
    as_tuple = lambda a: (a,) if isinstance(a, int) else tuple(a)
    red = tuple(int(a) % ndim for a in as_tuple(dims.reduction_axis))
    out = tuple(int(a) % ndim for a in as_tuple(dims.output_axis))
    return red, out


def _geometry(shape: tuple[int, ...], dims: MuonDimensionNumbers, path: str) -> Geometry:
    """The geometry a leaf's dimension numbers describe: reduction axes fan-in, output axes fan-out."""
    if len(shape) < 2:
        raise ValueError(f"parameter '{path}': Muon optimized parameters must have rank >= 2, got shape {shape}")
    red, out = _axes(len(shape), dims)
    if set(red) & set(out):
        raise ValueError(
            f"parameter '{path}': reduction axes {red} and output axes {out} of {dims} overlap (shape {shape}); "
            "give disjoint axes"
        )
    return Geometry(shape, "matrix", fan_in_axes=red, fan_out_axes=out)


def _coefficient_table(ns_coeffs, ns_steps) -> tuple[tuple[float, float, float], ...]:
    """The rows contrib iterates: a triple ``ns_steps`` times, or a table (at most ``ns_steps`` rows) once."""
    if isinstance(ns_coeffs, str):
        if ns_coeffs not in CONTRIB_NS_COEFFS:
            raise ValueError(f"Unknown ns_coeff preset string: {ns_coeffs}; use one of {sorted(CONTRIB_NS_COEFFS)}")
        ns_coeffs = CONTRIB_NS_COEFFS[ns_coeffs]
    table = jnp.asarray(ns_coeffs, dtype=jnp.float32)
    if table.ndim > 2 or table.shape[-1] != 3:
        raise ValueError(f"ns_coeffs must have shape (3,) or (n, 3), got {table.shape}")
    rows: list[tuple[float, float, float]] = [
        (float(row[0]), float(row[1]), float(row[2])) for row in (table[None] if table.ndim == 1 else table)
    ]
    if table.ndim == 1:
        return tuple(rows * int(ns_steps))
    if len(rows) > int(ns_steps):
        raise ValueError(f"Not enough coeffs to perform {ns_steps} steps: ns_coeffs has {len(rows)} rows")
    return tuple(rows[-int(ns_steps) :])


def _reference_orthogonalize(x, dims, table, preconditioning, eps):
    """contrib's iteration, written out: complex leaves and ``'spectral'`` preconditioning (which the
    engine does not run). ``x`` is moved to ``(batch, d_in, d_out)``, made wide, normalized
    (``||X||_F + eps``, ``||X||_2 + eps``, or, for ``'aol'`` / ``'schatten'``, in the first step), and
    iterated ``X <- a X + (b A + c A^2) X`` with ``A = X X^H``."""
    red, out = _axes(x.ndim, dims)
    batch = tuple(a for a in range(x.ndim) if a not in red + out)
    perm = batch + red + out
    shape = [x.shape[a] for a in perm]
    nb, nr = len(batch), len(red)
    m = x.transpose(perm).reshape((math.prod(shape[:nb]), math.prod(shape[nb : nb + nr]), -1))
    tall = m.shape[1] > m.shape[2]
    if tall:
        m = jnp.swapaxes(m, 1, 2)
    h = lambda a: jnp.swapaxes(a, 1, 2).conj()
    if preconditioning == "frobenius":
        m = m / (jnp.sqrt(jnp.sum(jnp.abs(m) ** 2, axis=(1, 2), keepdims=True)) + eps)
    elif preconditioning == "spectral":
        m = m / (jnp.linalg.norm(m, ord=2, axis=(1, 2), keepdims=True) + eps)
    for i, (a, b, c) in enumerate(table):
        gram = m @ h(m)
        if i == 0 and preconditioning == "aol":
            s = jax.lax.rsqrt(jnp.clip(jnp.abs(gram).sum(axis=-1), min=_AOL_EPS))[..., None]
            m, gram = m * s, gram * s * jnp.swapaxes(s, 1, 2)
        elif i == 0 and preconditioning == "schatten":
            s = jax.lax.rsqrt(jnp.clip(jnp.sqrt(jnp.sum(jnp.abs(gram) ** 2, axis=(1, 2), keepdims=True)), min=_AOL_EPS))
            m, gram = m * s, gram * s**2
        m = a * m + (b * gram + c * gram @ gram) @ m
    if tall:
        m = jnp.swapaxes(m, 1, 2)
    inverse = sorted(range(x.ndim), key=lambda i: perm[i])
    return m.reshape(shape).transpose(inverse).astype(x.dtype)


def _shape_scale(shape, dims, consistent_rms):
    red, out = _axes(len(shape), dims)
    d_in = 1
    for a in red:
        d_in *= shape[a]
    d_out = 1
    for a in out:
        d_out *= shape[a]
    if consistent_rms is None:
        return max(1.0, d_out / d_in) ** 0.5
    return consistent_rms * max(d_in, d_out) ** 0.5


def _scale_by_contrib_muon(
    table, beta, eps, mu_dtype, nesterov, adaptive, preconditioning, dims_fn
) -> optax.GradientTransformation:
    """contrib's ``scale_by_muon``: debiased (Nesterov) EMA momentum, then the orthogonalization."""
    mu_dtype = None if mu_dtype is None else jnp.dtype(mu_dtype)

    def init_fn(params):
        # count and ns_coeffs go onto the whole tree's mesh in contrib_muon's init (this route may see none).
        return MuonState(
            count=jnp.zeros([], jnp.int32),
            mu=optax.tree.zeros_like(params, dtype=mu_dtype),
            ns_coeffs=jnp.asarray(table, dtype=jnp.float32),
        )

    def orthogonalize(tree, dims_tree):
        leaves, treedef = jax.tree.flatten(tree)
        dims = treedef.flatten_up_to(dims_tree)
        out = list(leaves)
        engine, geoms = {}, {}
        for i, (x, d) in enumerate(zip(leaves, dims)):
            g = _geometry(tuple(x.shape), d, f"leaf {i}")
            if jnp.iscomplexobj(x) or preconditioning == "spectral":
                out[i] = _reference_orthogonalize(x, d, table, preconditioning, eps)
            else:
                engine[str(i)], geoms[str(i)] = x, g
        if engine:
            wide = jnp.promote_types(jnp.result_type(*engine.values()), jnp.float32)
            tx = orthogonalize_via_newton_schulz(
                geometry=GeometryMap({"": lambda path, shape: geoms[path]}),
                scale=1.0,
                ns_coefficients=table,
                ns_method="auto",
                compute_dtype=wide,
                ns_preconditioning=preconditioning,
            )
            done, _ = tx.update(engine, optax.EmptyState())
            for key, y in done.items():
                out[int(key)] = y
        return jax.tree.unflatten(treedef, out)

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count_inc = optax.safe_increment(state.count)
        mu_hat = debiased_momentum(mu, updates, beta, count_inc, nesterov)
        new = orthogonalize(mu_hat, dims_fn(updates))
        if adaptive:  # the dual norm <mu_hat, O> of the step (Bernstein et al., 2024)
            new = jax.tree.map(lambda x, y: jnp.sum(x.conj() * y) * y, mu_hat, new)
        return new, MuonState(count=count_inc, mu=optax.tree.cast(mu, mu_dtype), ns_coeffs=state.ns_coeffs)

    return optax.GradientTransformation(init_fn, update_fn)


def _scale_by_shape(dims_fn, consistent_rms) -> optax.GradientTransformation:
    def update_fn(updates, state, params=None):
        del params
        leaves, treedef = jax.tree.flatten(updates)
        dims = treedef.flatten_up_to(dims_fn(updates))
        out = [x * _shape_scale(x.shape, d, consistent_rms) for x, d in zip(leaves, dims)]
        return jax.tree.unflatten(treedef, out), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _check_arrays(params):
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not hasattr(x, "dtype") or not hasattr(x, "shape"):
            name = path_str(path)
            raise TypeError(
                f"parameter '{name}' is a {type(x).__name__}, not an array: the optimizer cannot update it "
                "in place. Store it as an array (jnp.asarray(value)) or keep it out of the parameter tree."
            )


def contrib_muon(
    learning_rate: optax.ScalarOrSchedule,
    ns_coeffs: Any = CONTRIB_NS_COEFFS["standard"],
    ns_steps: int = 5,
    beta: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: str = "frobenius",
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps_root: float = 0.0,
    adam_weight_decay: float = 0.0,
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: Any = None,
    consistent_rms: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    """``optax.contrib.muon``: its signature, defaults, routing, state structure and update.

    For every leaf with dimension numbers (by default every 2-D leaf, read as
    ``(d_in, d_out)``; ``muon_weight_dimension_numbers`` names the reduction
    and output axes of stacked or multi-axis kernels, every other axis being
    a batch of independent matrices)::

        m_t   = beta m_{t-1} + (1 - beta) g_t
        n_t   = beta m^_t + (1 - beta) g^_t  (nesterov, both debiased)  or  m^_t
        O_t   = NS(n_t) ~ U V^T                       (per matrix, ``preconditioning``)
        O_t  <- <n_t, O_t> O_t                         (adaptive)
        W    <- W - lr (s O_t + weight_decay W)

    with ``s = sqrt(max(1, d_out / d_in))``, or ``consistent_rms *
    sqrt(max(d_in, d_out))``. Every other leaf takes ``optax.adamw``
    (``adam_*``, ``eps``, ``nesterov``, ``mu_dtype``). The result is
    ``optax.partition({'muon': ..., 'adam': ...}, labels)``: the state has
    contrib's structure, so contrib's checkpoints restore into it.

    The orthogonalization runs on :func:`~spectral_optax.orthogonalize_via_newton_schulz`
    (dimension numbers -> :class:`~spectral_optax.Geometry`: reduction axes
    fan-in, output axes fan-out), with contrib's coefficient rows, float32
    (or wider) compute at full matmul precision, the Gram-space iteration
    where it saves flops, and the distributed plan on a mesh. Deliberate
    differences (each checked in tests/test_contrib_muon.py):

    * ``'frobenius'`` normalizes by ``||G||_F``, not ``||G||_F + eps``: the
      updates agree to ``~eps / ||G||_F`` relative (float32 rounding for
      ``||G||_F >~ 0.1``; a zero matrix gives a zero step in both);
    * the iteration runs in at least float32 at full precision (contrib runs
      it in the momentum's dtype at the backend's default matmul precision);
    * complex leaves and ``preconditioning='spectral'`` run contrib's
      iteration written out here (the engine is real and Frobenius/Schatten/
      AOL-normalized); for complex ``'schatten'`` the Gram matrix is
      ``X X^H`` (contrib forms ``X X^T``, which is not the Schatten-4 norm of
      a complex matrix);
    * the coefficients are read at construction (contrib re-reads
      ``state.ns_coeffs``; the state keeps them, with contrib's shape);
    * non-float leaves (integers, booleans) and size-0 leaves get a zero
      update under an extra ``'frozen'`` label (contrib would fail or step
      them), and a leaf that is not an array is rejected with its path.

    Args:
      learning_rate: learning rate or schedule of the Muon route (and of the
        Adam route unless ``adam_learning_rate`` is given).
      ns_coeffs: an ``(a, b, c)`` triple (run ``ns_steps`` times), a table of
        at most ``ns_steps`` rows (run once each), or a preset name:
        ``'standard'`` (Muon's quintic, the default) or ``'dion'``.
      ns_steps: number of Newton-Schulz iterations for a triple.
      beta: EMA momentum coefficient of the Muon route.
      eps: Adam's epsilon on the Adam route; added to the spectral norm for
        ``preconditioning='spectral'`` and to the complex leaves' Frobenius
        norm (see above).
      weight_decay: decoupled weight decay of the Muon route (multiplied by
        the learning rate).
      weight_decay_mask: ``optax.add_decayed_weights``' mask on the Muon
        route (a tree, a prefix, or a callable); ``None``: every Muon leaf.
      mu_dtype: dtype of both routes' first moments.
      nesterov: Nesterov momentum on both routes.
      adaptive: scale each orthogonalized step by the dual norm ``<n_t, O_t>``.
      preconditioning: ``'frobenius'`` (default), ``'spectral'`` (exact
        ``||G||_2 + eps``), ``'aol'`` (Turbo-Muon's row scaling in the first
        step) or ``'schatten'`` (Schatten-4 norm in the first step).
      adam_b1: Adam route's first-moment decay.
      adam_b2: Adam route's second-moment decay.
      adam_eps_root: Adam route's epsilon inside the square root.
      adam_weight_decay: Adam route's decoupled weight decay.
      adam_learning_rate: Adam route's learning rate (default: ``learning_rate``).
      muon_weight_dimension_numbers: ``None`` (every 2-D leaf is a Muon
        matrix), an ``optax.contrib.MuonDimensionNumbers`` for every leaf, a
        tree (or prefix tree) of them with ``None`` for Adam leaves, or a
        callable ``params -> such a tree``.
      consistent_rms: when given, scale by ``consistent_rms * sqrt(max(d_in,
        d_out))`` (0.2 matches AdamW's update RMS) instead of
        ``sqrt(max(1, d_out / d_in))``.

    Returns:
      An ``optax.GradientTransformationExtraArgs``: the ``optax.partition`` of
      the two routes and the frozen one.
    """
    if preconditioning not in _PRECONDITIONINGS:
        raise ValueError(f"Unknown preconditioning {preconditioning!r}; use one of {_PRECONDITIONINGS}")
    table = _coefficient_table(ns_coeffs, ns_steps)
    adam_lr = learning_rate if adam_learning_rate is None else adam_learning_rate
    spec = MuonDimensionNumbers() if muon_weight_dimension_numbers is None else muon_weight_dimension_numbers
    default_rule = muon_weight_dimension_numbers is None

    def dims_tree(params):
        return spec(params) if callable(spec) and not _is_dims(spec) else spec

    def labels(params):
        _check_arrays(params)

        def frozen(x):
            return not jnp.issubdtype(x.dtype, jnp.inexact) or x.size == 0

        if default_rule:
            return jax.tree.map(lambda x: "frozen" if frozen(x) else ("muon" if x.ndim == 2 else "adam"), params)
        populate = lambda d, sub: jax.tree.map(
            lambda x: "frozen" if frozen(x) else ("muon" if d is not None else "adam"), sub
        )
        return jax.tree.map(populate, dims_tree(params), params, is_leaf=lambda x: x is None or _is_dims(x))

    def muon_dims(updates):
        """The dimension numbers of the Muon leaves of the masked tree the route sees (prefixes expanded)."""
        masked = lambda x: isinstance(x, optax.MaskedNode)
        full = jax.tree.map(
            lambda d, sub: jax.tree.map(lambda _: d, sub, is_leaf=masked),
            dims_tree(updates),
            updates,
            is_leaf=lambda x: x is None or _is_dims(x),
        )
        return jax.tree.map(lambda u, d: u if masked(u) else d, updates, full, is_leaf=masked)

    def zero(updates, state, params=None):
        del params
        return jax.tree.map(jnp.zeros_like, updates), state

    tx = optax.partition(
        {
            "muon": optax.chain(
                _scale_by_contrib_muon(table, beta, eps, mu_dtype, nesterov, adaptive, preconditioning, muon_dims),
                _scale_by_shape(muon_dims, consistent_rms),
                optax.add_decayed_weights(weight_decay, weight_decay_mask),
                optax.scale_by_learning_rate(learning_rate),
            ),
            "adam": optax.adamw(
                learning_rate=adam_lr,
                b1=adam_b1,
                b2=adam_b2,
                eps=eps,
                eps_root=adam_eps_root,
                weight_decay=adam_weight_decay,
                mu_dtype=mu_dtype,
                nesterov=nesterov,
            ),
            "frozen": optax.GradientTransformation(optax.init_empty_state, zero),
        },
        labels,
    )

    def init_fn(params):
        # MuonState's count and coefficient table replicated on the mesh of the whole tree, the layout the
        # update returns them in, also when the Muon route holds no leaf (optax.partition masks them all).
        def place(s):
            if not isinstance(s, MuonState):
                return s
            return s._replace(
                count=replicated_on_mesh_of(s.count, params), ns_coeffs=replicated_on_mesh_of(s.ns_coeffs, params)
            )

        return jax.tree.map(place, tx.init(params), is_leaf=lambda s: isinstance(s, MuonState))

    def update_fn(updates, state, params=None, **extra_args):
        # On an Auto mesh the updates keep the gradients' layout, as every named optimizer's.
        new_updates, new_state = tx.update(updates, state, params, **extra_args)
        return keeping_layout(new_updates, updates), new_state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
