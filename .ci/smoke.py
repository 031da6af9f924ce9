"""Smoke test of an installed wheel: only its own package, import, one step of every named optimizer, lazy imports."""

import sys
from importlib import metadata

import jax
import jax.numpy as jnp
import optax

import spectral_optax as so

assert "flax.linen" not in sys.modules and "matplotlib" not in sys.modules, "import spectral_optax is not lazy"
assert so.__file__ and "site-packages" in so.__file__, f"not the installed wheel: {so.__file__}"
# The wheel installs one top-level package (plus its metadata): nothing that collides with another project's names.
files = metadata.files("spectral-optax") or []
top = sorted({f.parts[0] for f in files if not f.parts[0].endswith(".dist-info") and f.parts[0] != ".."})
assert top == ["spectral_optax"], f"the wheel installs top-level names other than spectral_optax: {top}"
params = {
    "Embed_0": {"embedding": jnp.ones((16, 8))},
    "Dense_0": {"kernel": jnp.linspace(-1.0, 1.0, 64).reshape(8, 8), "bias": jnp.ones(8)},
    "head": {"kernel": jnp.linspace(-1.0, 1.0, 24).reshape(8, 3)},
}
grads = jax.tree.map(lambda p: jnp.cos(p) + 0.1, params)
for name in ("muon", "moga", "spectral_sgd", "mup_sgd", "mup_adamw", "rescaled_adamw"):
    tx = getattr(so, name)(1e-2)
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    new = optax.apply_updates(params, updates)
    leaves = jax.tree.leaves(new)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in leaves), name
    assert any(bool(jnp.any(a != b)) for a, b in zip(leaves, jax.tree.leaves(params))), name
print("smoke test passed:", so.__version__, so.__file__)
