"""Two processes on 127.0.0.1 (``jax.distributed.initialize``), 4 CPU devices each, one mesh
over all 8: 10 training steps of a small Flax model with ``muon`` and ``moga`` (FSDP
parameters, data-parallel batch) equal a single-process 8-device run."""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(
    """
    import sys
    import jax
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if nproc > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    import jax.numpy as jnp, numpy as np, optax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P
    import spectral_optax as so

    assert jax.device_count() == 8 and jax.process_count() == nproc, (jax.device_count(), jax.process_count())
    # Auto axes: XLA places the model's FSDP all-gathers (Explicit ones would need reshards in the model)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    model = so.nn.linen.ResidualMLP(features=32, num_blocks=2, out_features=8)
    x = jax.random.normal(jax.random.key(1), (64, 16))
    y = jax.random.normal(jax.random.key(2), (64, 8))
    params = model.init(jax.random.key(0), x)["params"]

    def fsdp(a):  # first axis over all 8 devices when divisible, else replicated
        return NamedSharding(mesh, P("data") if a.ndim and a.shape[0] % 8 == 0 else P())

    def loss_fn(p, x, y):
        return jnp.mean((model.apply({"params": p}, x) - y) ** 2)

    results = {}
    for name, tx in (("muon", so.muon(0.02)), ("moga", so.moga(0.01))):
        shardings = jax.tree.map(fsdp, params)
        p = jax.jit(lambda t: t, out_shardings=shardings)(params)
        state = jax.jit(tx.init)(p)
        batch = NamedSharding(mesh, P("data"))
        xs, ys = (jax.make_array_from_callback(a.shape, batch, lambda i, a=a: np.asarray(a)[i]) for a in (x, y))

        @jax.jit
        def step(p, state, xs, ys):
            g = jax.grad(loss_fn)(p, xs, ys)
            u, state = tx.update(g, state, p)
            return optax.apply_updates(p, u), state

        for _ in range(10):
            p, state = step(p, state, xs, ys)
        for path, leaf in jax.tree_util.tree_leaves_with_path(p):
            results[name + jax.tree_util.keystr(path)] = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    if pid == 0:
        np.savez(out, **results)
    print("done", pid)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    return dict(
        os.environ,
        XLA_FLAGS=xla_flags(f"--xla_force_host_platform_device_count={devices}"),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    port = str(_free_port())
    multi, single = tmp_path / "multi.npz", tmp_path / "single.npz"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(i), "2", port, str(multi)], env=_env(4),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    ref = subprocess.run(
        [sys.executable, "-c", SCRIPT, "0", "1", "0", str(single)], env=_env(8),
        capture_output=True, text=True, timeout=300, check=False,
    )
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            outs.append(proc.communicate()[0])
    assert ref.returncode == 0, ref.stdout + ref.stderr[-4000:]
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out[-4000:]
    a, b = np.load(multi), np.load(single)
    assert sorted(a.files) == sorted(b.files) and any(k.startswith("moga") for k in a.files)
    for k in a.files:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5 * float(np.max(np.abs(b[k]))), err_msg=k)
