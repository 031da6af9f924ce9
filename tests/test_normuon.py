"""normuon and scale_by_neuron_second_moment, checked against a float64 NumPy reference over several steps."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so

QUINTIC = (3.4445, -4.7750, 2.0315)  # Muon's quintic, written out (Jordan et al. 2024)


def ns_ref(g):
    """float64 Newton-Schulz on a (d_in, d_out) matrix: Frobenius-normalized, 5 quintic steps."""
    x = np.asarray(g, np.float64)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / np.linalg.norm(x)
    a, b, c = QUINTIC
    for _ in range(5):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def normuon_ref(params, grads_seq, lr, wd, beta1=0.95, beta2=0.95, eps=1e-8):
    """NorMuon (Li et al. 2025, Algorithm 1; Frobenius-preserving rescale) on (d_in, d_out) matrices.

    Neurons are the fan-out columns; the update RMS target is 0.2 sqrt(max(d_in, d_out)) times the
    orthogonal factor's Frobenius norm ratio."""
    w = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros(x.shape[1]) for k, x in w.items()}
    for grads in grads_seq:
        for k in w:
            g = np.asarray(grads[k], np.float64)
            m[k] = beta1 * m[k] + (1 - beta1) * g
            o = ns_ref(m[k])
            v[k] = beta2 * v[k] + (1 - beta2) * np.mean(o**2, axis=0)
            o2 = o / (np.sqrt(v[k]) + eps)
            o2 = o2 * np.linalg.norm(o) / np.linalg.norm(o2)
            d_in, d_out = o.shape
            w[k] = w[k] - lr * (0.2 * math.sqrt(max(d_in, d_out)) * o2 + wd * w[k])
    return w


def _conv_as_matrix(x):  # (kh, kw, in, out) -> (kh*kw*in, out): the canonical view
    return np.asarray(x).reshape(-1, x.shape[-1])


def test_normuon_matches_float64_reference_over_steps():
    rng = np.random.default_rng(0)
    shapes = {"wide": (12, 40), "tall": (40, 12)}
    params = {
        "wide": {"kernel": jnp.asarray(rng.normal(size=shapes["wide"]) * 0.1, jnp.float32)},
        "tall": {"kernel": jnp.asarray(rng.normal(size=shapes["tall"]) * 0.1, jnp.float32)},
        "conv": {"kernel": jnp.asarray(rng.normal(size=(3, 3, 4, 6)) * 0.1, jnp.float32)},
    }
    # Gradients with unequal neuron scales, so the per-neuron normalization matters.
    col = {k: np.exp(rng.normal(size=s[1])) for k, s in {**shapes, "conv": (36, 6)}.items()}
    grads_seq = []
    for _ in range(4):
        grads_seq.append(
            {
                "wide": {"kernel": jnp.asarray(rng.normal(size=shapes["wide"]) * col["wide"], jnp.float32)},
                "tall": {"kernel": jnp.asarray(rng.normal(size=shapes["tall"]) * col["tall"], jnp.float32)},
                "conv": {"kernel": jnp.asarray(rng.normal(size=(3, 3, 4, 6)) * col["conv"], jnp.float32)},
            }
        )
    lr, wd = 0.05, 0.1
    tx = so.normuon(lr, weight_decay=wd, ns_coefficients="quintic", ns_steps=5, compute_dtype=jnp.float32)
    state = tx.init(params)
    step = jax.jit(tx.update)
    p = params
    for grads in grads_seq:
        u, state = step(grads, state, p)
        p = optax.apply_updates(p, u)
    flat = lambda t: {k: _conv_as_matrix(v["kernel"]) for k, v in t.items()}
    ref = normuon_ref(flat(params), [flat(g) for g in grads_seq], lr, wd)
    for k, got in flat(p).items():
        np.testing.assert_allclose(got, ref[k], rtol=0, atol=2e-5, err_msg=k)
    # The per-neuron step differs from Muon's (scale='rms'): the normalization is wired in.
    mu = so.muon(lr, weight_decay=wd, scale="rms", nesterov=False, ns_coefficients="quintic")
    u_mu, _ = mu.update(grads_seq[0], mu.init(params), params)
    u_no, _ = tx.update(grads_seq[0], tx.init(params), params)
    assert np.max(np.abs(np.asarray(u_mu["wide"]["kernel"] - u_no["wide"]["kernel"]))) > 1e-3


def test_neuron_second_moment_transform_state_and_zero():
    g = {"w": jnp.zeros((2, 8, 5)), "d": jnp.ones((7, 3))}
    tx = so.scale_by_neuron_second_moment(geometry={"w": so.Geometry.matrix((2, 8, 5))})  # 2 stacked slices
    state = tx.init(g)
    assert state.nu["d"].shape == (1, 3) and state.nu["w"].shape == (2, 5)
    u, state = tx.update(g, state)
    assert np.all(np.asarray(u["w"]) == 0) and np.all(np.isfinite(np.asarray(u["d"])))
    # A column-constant matrix: every neuron has the same second moment, the result keeps O's norm
    # times sqrt(d_out / d_in) ('spectral').
    np.testing.assert_allclose(
        np.linalg.norm(np.asarray(u["d"])), np.linalg.norm(np.ones((7, 3))) * math.sqrt(3 / 7), rtol=1e-6
    )
    with pytest.raises(ValueError, match="beta"):
        so.scale_by_neuron_second_moment(beta=1.0)
    with pytest.raises(TypeError):
        so.normuon(0.1, after_orthogonalize=None)  # the Muon route's last step is normuon's own
