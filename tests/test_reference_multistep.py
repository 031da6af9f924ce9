"""Multi-step trajectories of every named optimizer against float64 NumPy references.

Each reference below is written from the optimizer's documented math, in
float64 NumPy, independently of the package (no package function is called
to produce an expected number). Every test runs >= 4 steps with
non-default hyperparameters (betas, epsilons, Nesterov, weight decay and its
default mask, custom routes), on a Flax-named tree whose layers have
``d_out > d_in``, ``d_out < d_in``, an embedding, biases, a norm scale and a
read-out head; the muP variants run at a width different from their base.
After 2 steps an Adam step is no longer ~sign(g), so wrong betas / epsilon /
bias correction show up; with ``base != params`` a multiplier moved before
Adam (which cancels it) shows up.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so

# float64 / cross-path comparisons: true float32 matmuls on every backend (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("highest_precision")

STEPS = 4
QUINTIC = (3.4445, -4.7750, 2.0315)


def model(width=10, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {
        "Embed_0": {"embedding": (11, 6)},
        "Dense_0": {"kernel": (6, width), "bias": (width,)},
        "LayerNorm_0": {"scale": (width,)},
        "Dense_1": {"kernel": (width, 7)},
        "head": {"kernel": (7, 3), "bias": (3,)},
    }
    return jax.tree.map(lambda s: rng.standard_normal(s), shapes, is_leaf=lambda x: isinstance(x, tuple))


def grads_seq(params, seed=1):
    rng = np.random.default_rng(seed)
    # Mixed magnitudes per step so that Adam's second moment matters.
    return [jax.tree.map(lambda p: rng.standard_normal(p.shape) * 10.0 ** rng.uniform(-2, 1), params)
            for _ in range(STEPS)]


def run(tx, params, grads):
    """The package's trajectory in float32 (params after each step, float64 NumPy)."""
    p = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    state = tx.init(p)
    update = jax.jit(tx.update)
    out = []
    for g in grads:
        g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g)
        u, state = update(g, state, p)
        p = optax.apply_updates(p, u)
        out.append(jax.tree.map(lambda x: np.asarray(x, np.float64), p))
    return out


def check(got, want, rtol=2e-4):
    for t, (a, b) in enumerate(zip(got, want)):
        for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.max(np.abs(y)),
                                       err_msg=f"step {t + 1}, {jax.tree_util.keystr(path)}")


def flat(tree):
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def unflat(d, like):
    return jax.tree_util.tree_unflatten(jax.tree.structure(like), [d[k] for k in flat(like)])


KIND = {"['Embed_0']['embedding']": "embedding", "['Dense_0']['kernel']": "hidden",
        "['Dense_0']['bias']": "vector", "['LayerNorm_0']['scale']": "vector",
        "['Dense_1']['kernel']": "hidden", "['head']['kernel']": "output", "['head']['bias']": "vector"}


# ----------------------------------------------------------------- NumPy pieces
def ns_reference(g, steps=5, coeffs=QUINTIC):
    """Muon's Newton-Schulz iteration in float64 on the short side."""
    x = g / np.linalg.norm(g)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    a, b, c = coeffs
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class AdamRef:
    def __init__(self, b1, b2, eps, nesterov=False):
        self.b1, self.b2, self.eps, self.m, self.v, self.t = b1, b2, eps, 0.0, 0.0, 0
        self.nesterov = nesterov

    def __call__(self, g):
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * g
        self.v = self.b2 * self.v + (1 - self.b2) * g * g
        mh = self.m / (1 - self.b1**self.t)
        if self.nesterov:  # optax's form
            mh = self.b1 * self.m / (1 - self.b1 ** (self.t + 1)) + (1 - self.b1) * g / (1 - self.b1**self.t)
        vh = self.v / (1 - self.b2**self.t)
        return mh / (np.sqrt(vh) + self.eps)


class EmaRef:
    def __init__(self, beta, nesterov):
        self.beta, self.nesterov, self.mu = beta, nesterov, 0.0

    def __call__(self, g):
        self.mu = self.beta * self.mu + (1 - self.beta) * g
        return self.beta * self.mu + (1 - self.beta) * g if self.nesterov else self.mu


class TraceRef:  # optax.trace: m = g + beta m; nesterov: g + beta m
    def __init__(self, beta, nesterov):
        self.beta, self.nesterov, self.m = beta, nesterov, 0.0

    def __call__(self, g):
        self.m = g + self.beta * self.m
        return g + self.beta * self.m if self.nesterov else self.m


def rms_rows(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))


def reference(params, grads, direction, lr, wd, decay):
    """``W <- W - lr_t * (direction(path, g) + wd * decay(path) * W)`` leaf by leaf."""
    p = flat(params)
    out = []
    for t, g in enumerate(grads):
        lr_t = lr(t) if callable(lr) else lr
        g = flat(g)
        p = {k: w - lr_t * (direction(k, g[k]) + (wd * w if decay(k) else 0.0)) for k, w in p.items()}
        out.append(unflat(p, params))
    return out


def stateful(factory):
    """``path -> per-leaf state`` created on first use."""
    states = {}

    def get(k):
        if k not in states:
            states[k] = factory(k)
        return states[k]

    return get


# ----------------------------------------------------------------- muon
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_default_newton_schulz_and_adamw_routes(nesterov):
    params = model()
    grads = grads_seq(params)
    lr, adam_lr, wd, adam_wd = 0.03, 0.01, 0.1, 0.05
    tx = so.muon(lr, momentum=0.9, nesterov=nesterov, weight_decay=wd, adam_learning_rate=adam_lr,
                 adam_b1=0.8, adam_b2=0.95, adam_eps=1e-3, adam_weight_decay=adam_wd)
    ema = stateful(lambda k: EmaRef(0.9, nesterov))
    adam = stateful(lambda k: AdamRef(0.8, 0.95, 1e-3))
    p = flat(params)
    want = []
    for g in grads:
        g = flat(g)
        new = {}
        for k, w in p.items():
            if KIND[k] in ("hidden", "output"):
                d_in, d_out = w.shape
                o = ns_reference(ema(k)(g[k])) * np.sqrt(d_out / d_in)
                new[k] = w - lr * (o + wd * w)
            else:  # AdamW route; the default mask spares vectors
                decay = adam_wd if KIND[k] == "embedding" else 0.0
                new[k] = w - adam_lr * (adam(k)(g[k]) + decay * w)
        p = new
        want.append(unflat(p, params))
    check(run(tx, params, grads), want, rtol=5e-4)


def test_muon_ns_steps_method_and_scale_wiring():
    params = model()
    grads = grads_seq(params, seed=3)
    tx = so.muon(0.02, momentum=0.8, ns_steps=3, ns_method="gram", scale="muon",
                 compute_dtype=jnp.float32, vector="normalize", embedding="normalize")
    ema = stateful(lambda k: EmaRef(0.8, True))

    def direction(k, g):
        m = ema(k)(g)
        if KIND[k] in ("hidden", "output"):
            d_in, d_out = m.shape
            return ns_reference(m, steps=3) * np.sqrt(max(1.0, d_out / d_in))
        return rms_rows(m)  # 'normalize': each fan-out vector (vectors: the whole vector) to RMS 1

    want = reference(params, grads, direction, 0.02, 0.0, lambda k: False)
    check(run(tx, params, grads), want, rtol=5e-4)


# ----------------------------------------------------------------- moga
def row_dual(m, p, fan=True):
    """(p,mean)->inf dual: per output column i, sign |m|^(p-1) / ||m_i||_p^(p-1) * d_in^(-1/p)."""
    norm = np.sum(np.abs(m) ** p, axis=0, keepdims=True) ** (1 / p)
    d = np.sign(m) * np.abs(m) ** (p - 1) / norm ** (p - 1)
    return d * m.shape[0] ** (-1 / p) if fan else d


def col_dual(m, q):
    qs = q / (q - 1)
    norm = np.sum(np.abs(m) ** qs, axis=1, keepdims=True) ** (1 / qs)
    return np.sign(m) * np.abs(m) ** (qs - 1) / norm ** (qs - 1) * m.shape[1] ** (1 / q) / m.shape[0]


@pytest.mark.parametrize("variant", ["row", "col"])
def test_moga_rules_and_custom_adam_route(variant):
    params = model()
    grads = grads_seq(params, seed=4)
    p, base_factor, wd = 1.5, 20.0, 0.1
    tx = so.moga(0.01, p=p, variant=variant, base_factor=base_factor, momentum=0.9, nesterov=True,
                 weight_decay=wd, rules={r"Dense_1/kernel$": "adam"}, adam_b2=0.95, adam_eps=1e-3)
    ema = stateful(lambda k: EmaRef(0.9, True))
    adam = stateful(lambda k: AdamRef(0.9, 0.95, 1e-3, nesterov=True))  # the 'adam' rule follows nesterov=
    q = p / (p - 1)

    def direction(k, g):
        if k == "['Dense_1']['kernel']":
            return adam(k)(g)
        m = ema(k)(g)
        if KIND[k] == "hidden":
            return base_factor * (row_dual(m, p) if variant == "row" else col_dual(m, q))
        if KIND[k] == "output":
            return row_dual(m, p, fan=False)
        return np.sign(m)

    want = reference(params, grads, direction, 0.01, wd, lambda k: KIND[k] != "vector")
    check(run(tx, params, grads), want)


# ----------------------------------------------------------------- spectral_sgd, mup_sgd
def test_spectral_sgd_nesterov_schedule_and_decay():
    params = model()
    grads = grads_seq(params, seed=5)
    sched = optax.linear_schedule(0.05, 0.01, STEPS)
    tx = so.spectral_sgd(sched, momentum=0.8, nesterov=True, weight_decay=0.05)
    mom = stateful(lambda k: TraceRef(0.8, True))

    def direction(k, g):
        m = mom(k)(g)
        if KIND[k] in ("hidden", "output"):
            return np.sqrt(m.shape[1] / m.shape[0]) * m / np.linalg.norm(m)
        return rms_rows(m)  # embeddings: each token's row; vectors: the whole vector

    want = reference(params, grads, direction, lambda t: 0.05 + (0.01 - 0.05) * t / STEPS, 0.05,
                     lambda k: KIND[k] != "vector")
    check(run(tx, params, grads), want)


def n_in(kind, shape):
    return shape[0] if kind in ("hidden", "output") else 1


def d_out(shape):
    return shape[-1]


def test_mup_sgd_at_another_width_with_nesterov():
    params, base = model(width=10), model(width=4, seed=9)
    grads = grads_seq(params, seed=6)
    tx = so.mup_sgd(0.02, base=base, momentum=0.9, nesterov=True, weight_decay=0.01)
    bshape = {k: v.shape for k, v in flat(base).items()}
    mom = stateful(lambda k: TraceRef(0.9, True))

    def direction(k, g):
        c = (d_out(g.shape) / n_in(KIND[k], g.shape)) / (d_out(bshape[k]) / n_in(KIND[k], bshape[k]))
        return c * mom(k)(g)

    want = reference(params, grads, direction, 0.02, 0.01, lambda k: KIND[k] != "vector")
    check(run(tx, params, grads), want)


# ----------------------------------------------------------------- Adam family
def test_mup_adamw_multipliers_after_adam_at_another_width():
    params, base = model(width=10), model(width=4, seed=9)
    grads = grads_seq(params, seed=7)
    tx = so.mup_adamw(0.01, base=base, b1=0.8, b2=0.95, eps=1e-3, weight_decay=0.1)
    bshape = {k: v.shape for k, v in flat(base).items()}
    adam = stateful(lambda k: AdamRef(0.8, 0.95, 1e-3))

    def direction(k, g):
        c = n_in(KIND[k], bshape[k]) / n_in(KIND[k], g.shape)  # (1/n_in) / (1/n_in_base)
        return c * adam(k)(g)

    # The widened layers really get other multipliers (else this test could not fail).
    assert {KIND[k]: n_in(KIND[k], bshape[k]) / n_in(KIND[k], v.shape) for k, v in flat(params).items()
            }["hidden"] != 1.0
    want = reference(params, grads, direction, 0.01, 0.1, lambda k: KIND[k] != "vector")
    check(run(tx, params, grads), want)


@pytest.mark.parametrize(("p", "q"), [(1.0, np.inf), (2.0, 2.0)])
def test_rescaled_adamw_fan_factor_after_adam(p, q):
    params = model()
    grads = grads_seq(params, seed=8)
    tx = so.rescaled_adamw(0.01, p=p, q=q, b1=0.7, b2=0.9, eps=1e-4, weight_decay=0.2)
    adam = stateful(lambda k: AdamRef(0.7, 0.9, 1e-4))

    def direction(k, g):
        s = 1.0
        if KIND[k] in ("hidden", "output"):
            s = (1.0 if np.isinf(q) else g.shape[1] ** (1 / q)) / g.shape[0] ** (1 / p)
        return s * adam(k)(g)

    want = reference(params, grads, direction, 0.01, 0.2, lambda k: KIND[k] != "vector")
    check(run(tx, params, grads), want)


# ----------------------------------------------------------------- optax.contrib.muon
@pytest.mark.parametrize("kwargs", [
    {},
    {"nesterov": False, "beta": 0.8, "eps": 1e-6, "weight_decay": 0.1, "adam_weight_decay": 0.05, "adam_b1": 0.7,
     "adam_b2": 0.9, "adam_learning_rate": 0.01},
    {"consistent_rms": 0.2, "ns_steps": 4},
])
def test_contrib_muon_matches_optax_contrib_muon(kwargs):
    rng = np.random.default_rng(0)
    params = {"a": rng.standard_normal((12, 5)), "b": rng.standard_normal((4, 9)),
              "Embed_0": {"embedding": rng.standard_normal((6, 3))}, "c": rng.standard_normal((7,)),
              "d": rng.standard_normal((2, 3, 4)), "e": np.asarray(1.5)}
    grads = [jax.tree.map(lambda x: rng.standard_normal(np.shape(x)), params) for _ in range(5)]
    want = run(optax.contrib.muon(0.05, **kwargs), params, grads)
    got = run(so.contrib_muon(0.05, **kwargs), params, grads)  # no geometry warning: contrib's rule decides
    check(got, want, rtol=1e-5)
    # The default muon differs from contrib on the tall 12 -> 5 matrix (sqrt(5/12) vs 1):
    # the difference contrib_muon exists for.
    if not kwargs:
        other = run(so.muon(0.05, scale="spectral"), params, grads)
        assert not np.allclose(other[0]["a"], want[0]["a"], rtol=1e-3)


# ----------------------------------------------------------------- geometry overrides reach every route
@pytest.mark.parametrize("name", ["muon", "moga", "spectral_sgd", "mup_sgd", "mup_adamw", "rescaled_adamw"])
def test_geometry_override_equals_separate_dense_layers(name):
    """A stacked (3, 4, 5) leaf declared by override equals three separate 4 -> 5 Dense kernels.

    Without the override the leaf would take the element-wise fallback, so an optimizer that
    dropped its ``geometry=`` argument anywhere fails here. The separate layers are named
    ``layer{i}``: default names (``Dense_0 .. Dense_2``) would make the last one the guessed read-out.
    """
    make = {"muon": so.muon, "moga": so.moga, "spectral_sgd": so.spectral_sgd, "mup_sgd": so.mup_sgd,
            "mup_adamw": so.mup_adamw, "rescaled_adamw": so.rescaled_adamw}[name]
    rng = np.random.default_rng(11)
    w = rng.standard_normal((3, 4, 5))
    stacked = {"blocks": {"w": w}}
    separate = {f"layer{i}": {"kernel": w[i]} for i in range(3)}
    override = {r"blocks/w$": {"kind": "matrix", "fan_in_axes": (1,), "fan_out_axes": (2,)}}
    kw_stacked, kw_separate = {}, {}
    if name.startswith("mup"):  # a base at another width, read through the same override
        kw_stacked = {"base": {"blocks": {"w": np.zeros((3, 2, 5))}}}
        kw_separate = {"base": {f"layer{i}": {"kernel": np.zeros((2, 5))} for i in range(3)}}
    gs = [rng.standard_normal((3, 4, 5)) for _ in range(3)]
    got = run(make(0.01, geometry=override, **kw_stacked), stacked, [{"blocks": {"w": g}} for g in gs])
    want = run(make(0.01, **kw_separate), separate, [{f"layer{i}": {"kernel": g[i]} for i in range(3)} for g in gs])
    for a, b in zip(got, want):
        for i in range(3):
            np.testing.assert_allclose(a["blocks"]["w"][i], b[f"layer{i}"]["kernel"], rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------- tests added for surviving mutants
@pytest.mark.parametrize("q", [np.inf, 3.0])
def test_injected_column_exponent_equals_static(q):
    """A traced q (inject_hyperparams) takes the traced conjugate-exponent path; it must equal
    the static one and the float64 column dual."""
    rng = np.random.default_rng(12)
    g = {"Dense_0": {"kernel": jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)}}
    static = so.scale_by_column_norm(q)
    injected = optax.inject_hyperparams(so.scale_by_column_norm)(q=q)
    a, _ = static.update(g, static.init(g))
    b, _ = jax.jit(injected.update)(g, injected.init(g))  # jit: q is a tracer, not a concrete value
    m = np.asarray(g["Dense_0"]["kernel"], np.float64)
    want = np.sign(m) / m.shape[0] if np.isinf(q) else col_dual(m, q)
    np.testing.assert_allclose(a["Dense_0"]["kernel"], want, rtol=1e-5)
    np.testing.assert_allclose(b["Dense_0"]["kernel"], want, rtol=1e-5)


def test_spectral_sgd_power_method_against_svd():
    """method='power' divides by sigma_max (float64 SVD), not by the Frobenius norm."""
    rng = np.random.default_rng(13)
    u, v = rng.standard_normal((6, 1)), rng.standard_normal((1, 9))
    g = 5.0 * u @ v + rng.standard_normal((6, 9))  # a clear spectral gap: power iteration converges
    params = {"Dense_0": {"kernel": np.zeros((6, 9))}}
    got = run(so.spectral_sgd(0.1, momentum=None, method="power"), params, [{"Dense_0": {"kernel": g}}])
    want = -0.1 * np.sqrt(9 / 6) * g / np.linalg.svd(g, compute_uv=False)[0]
    np.testing.assert_allclose(got[0]["Dense_0"]["kernel"], want, rtol=1e-4, atol=1e-6)
    state = so.scale_by_spectral_norm(method="power").init(params)
    assert state.right_vectors.shape == (9,)  # one (num_slices x d_out) block per matrix, flattened
    assert so.scale_by_spectral_norm().init(params).right_vectors.shape == (0,)
    with pytest.raises(ValueError, match="initial_power_iterations must be >= 1"):
        so.scale_by_spectral_norm(method="power", initial_power_iterations=0)


def test_mup_adamw_documented_defaults():
    """b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-4 on matrices and embeddings (not vectors)."""
    params = model()
    grads = grads_seq(params, seed=14)
    adam = stateful(lambda k: AdamRef(0.9, 0.999, 1e-8))
    want = reference(params, grads, lambda k, g: adam(k)(g), 0.01, 1e-4, lambda k: KIND[k] != "vector")
    check(run(so.mup_adamw(0.01, base=params), params, grads), want)


@pytest.mark.parametrize("p", [2.0, 2.5, 3.0, 3.7])
def test_row_dual_exponent_paths_against_float64(p):
    """p = 2 (normalization), half-integer, integer and general (exp-log) exponent paths."""
    rng = np.random.default_rng(15)
    m = rng.standard_normal((7, 5))
    tx = so.scale_by_row_norm(p)
    g = {"Dense_0": {"kernel": jnp.asarray(m, jnp.float32)}}
    out, _ = tx.update(g, tx.init(g))
    np.testing.assert_allclose(out["Dense_0"]["kernel"], row_dual(m, p), rtol=2e-5, atol=1e-7)
    with pytest.raises(ValueError):
        so.expert.lp_dual_direction(jnp.ones((3, 4)), 2.0, axis=1)  # needs the (slices, d_in, d_out) view


def test_rescaled_adamw_injected_exponents_geometry_decay_and_q_range():
    params = model()
    grads = grads_seq(params, seed=16)
    geometry = {r"Dense_1/kernel$": "vector"}  # declared a vector: fan factor 1 and no decay
    static = so.rescaled_adamw(0.01, p=2.0, q=2.0, weight_decay=0.5, geometry=geometry)
    injected = optax.inject_hyperparams(so.rescaled_adamw)(learning_rate=0.01, p=2.0, q=2.0, weight_decay=0.5,
                                                           geometry=geometry)
    adam = stateful(lambda k: AdamRef(0.9, 0.999, 1e-8))

    def direction(k, g):
        s = 1.0
        if KIND[k] in ("hidden", "output") and k != "['Dense_1']['kernel']":
            s = g.shape[1] ** 0.5 / g.shape[0] ** 0.5
        return s * adam(k)(g)

    def decay(k):
        return KIND[k] != "vector" and k != "['Dense_1']['kernel']"

    want = reference(params, grads, direction, 0.01, 0.5, decay)
    check(run(static, params, grads), want)
    check(run(injected, params, grads), want)
    so.rescaled_adamw(0.01, q=0.5)  # 0 < q <= 1 is valid


def test_mup_adamw_absolute_multipliers_without_base():
    """base=None: the absolute muP multiplier 1 / n_in (n_in = d_in for matrices, 1 otherwise)."""
    params = model()
    grads = grads_seq(params, seed=17)
    adam = stateful(lambda k: AdamRef(0.9, 0.999, 1e-8))
    want = reference(params, grads, lambda k, g: adam(k)(g) / n_in(KIND[k], g.shape), 0.01, 0.0, lambda k: False)
    check(run(so.mup_adamw(0.01, weight_decay=0.0), params, grads), want)
