"""``so.orthogonalize_via_newton_schulz``: how same-shape matrices are batched through the iteration."""

import jax.numpy as jnp
import numpy as np
import pytest


@pytest.mark.usefixtures("highest_precision")
def test_batched_orthogonalization_is_one_call_split_back():
    """Same-shape matrices are stacked into one call of the iteration and split back in order.
    (The padding to the owners / split sizes of a mesh now lives in the plan; tests/test_pod_plan.py
    checks it against a float64 reference on 16 devices.)"""
    from spectral_optax._transforms.orthogonalize import _batched

    rng = np.random.default_rng(14)
    mats = [jnp.asarray(rng.standard_normal((n, 3, 5)), jnp.float32) for n in (2, 1, 2)]
    seen = []

    def iteration(stacked):
        seen.append(stacked)
        return stacked * 2.0 + jnp.arange(stacked.shape[0], dtype=stacked.dtype)[:, None, None]

    blocks = _batched(mats, iteration)
    assert len(seen) == 1 and seen[0].shape == (5, 3, 5)
    assert [b.shape for b in blocks] == [(2, 3, 5), (1, 3, 5), (2, 3, 5)]
    offset = 0
    for b, m in zip(blocks, mats):  # each block is its own slices of the one result, in order
        ref = 2.0 * np.asarray(m) + np.arange(offset, offset + m.shape[0])[:, None, None]
        np.testing.assert_allclose(np.asarray(b), ref, rtol=1e-6)
        offset += m.shape[0]
