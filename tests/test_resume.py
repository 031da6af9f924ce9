"""Exact resume: save the optimizer state with orbax-checkpoint mid-run, restore
it in a fresh process, continue; the params after 50 steps equal the
uninterrupted run's bit for bit (CPU), for every named optimizer.

The fresh process is this file run as a script (``python test_resume.py
DIR``): it rebuilds each optimizer, restores ``(params, opt_state)`` into
the structure of ``opt.init(params)``, runs the remaining steps with the
same jitted step and writes the final params.
"""

import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

STEPS, SAVE_AT = 50, 23


def optimizers():
    import spectral_optax as so

    return {
        "muon": so.muon(0.02, weight_decay=0.05, adam_learning_rate=0.003),
        "contrib_muon": so.contrib_muon(0.02),
        "moga": so.moga(0.01, p=1.5, weight_decay=0.05),
        "spectral_sgd": so.spectral_sgd(0.05, method="power", nesterov=True),
        "mup_sgd": so.mup_sgd(0.05, momentum=0.9, base={"Dense_0": {"kernel": jnp.zeros((4, 4))}, "Dense_1": {
            "kernel": jnp.zeros((4, 3)), "bias": jnp.zeros((3,))}, "Embed_0": {"embedding": jnp.zeros((7, 4))}}),
        "mup_adamw": so.mup_adamw(0.01, weight_decay=0.1),
        "rescaled_adamw": so.rescaled_adamw(0.01),
    }


def init_params():
    rng = np.random.default_rng(0)
    shapes = {"Embed_0": {"embedding": (7, 4)}, "Dense_0": {"kernel": (4, 8)},
              "Dense_1": {"kernel": (8, 3), "bias": (3,)}}
    return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s) * 0.5, jnp.float32), shapes,
                        is_leaf=lambda x: isinstance(x, tuple))


def loss(params, t):
    """A small model whose gradients depend on the params (and the step, through the batch)."""
    key = jax.random.fold_in(jax.random.key(1), t)
    tokens = jax.random.randint(key, (16,), 0, 7)
    h = params["Embed_0"]["embedding"][tokens]
    h = jnp.tanh(h @ params["Dense_0"]["kernel"])
    y = h @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"]
    return jnp.mean((y - jnp.sin(tokens[:, None] + jnp.arange(3.0))) ** 2)


def make_step(tx):
    @jax.jit
    def step(params, state, t):
        g = jax.grad(loss)(params, t)
        u, state = tx.update(g, state, params)
        return jax.tree.map(lambda p, d: p + d, params, u), state

    return step


def run(tx, params, state, start, stop):
    step = make_step(tx)
    for t in range(start, stop):
        params, state = step(params, state, jnp.asarray(t, jnp.int32))
    return params, state


def checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def resume(directory):
    """The fresh process: restore every optimizer's (params, state) and finish the run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = {}
        for name, tx in optimizers().items():
            params = init_params()
            target = {"params": params, "opt_state": tx.init(params)}
            ckpt = checkpointer()
            restored = ckpt.restore(os.path.join(directory, name), target)
            ckpt.close()
            p, _ = run(tx, restored["params"], restored["opt_state"], SAVE_AT, STEPS)
            for i, leaf in enumerate(jax.tree.leaves(p)):
                out[f"{name}/{i}"] = np.asarray(leaf)
        np.savez(os.path.join(directory, "resumed.npz"), **out)


@pytest.mark.slow
def test_resume_in_a_fresh_process_is_bitwise_exact(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        straight = {}
        for name, tx in optimizers().items():
            params = init_params()
            full, _ = run(tx, params, tx.init(params), 0, STEPS)
            straight[name] = [np.asarray(x) for x in jax.tree.leaves(full)]
            half_p, half_s = run(tx, params, tx.init(params), 0, SAVE_AT)
            ckpt = checkpointer()
            ckpt.save(tmp_path / name, {"params": half_p, "opt_state": half_s})
            ckpt.wait_until_finished()
            ckpt.close()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = np.load(tmp_path / "resumed.npz")
    for name, leaves in straight.items():
        for i, want in enumerate(leaves):
            got = resumed[f"{name}/{i}"]
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want, err_msg=f"{name} leaf {i}")  # bitwise
        # The run moved the params (else equality would prove nothing).
        assert not np.array_equal(leaves[0], np.asarray(jax.tree.leaves(init_params())[0]))


if __name__ == "__main__":
    resume(sys.argv[1])
