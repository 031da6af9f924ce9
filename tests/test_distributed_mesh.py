"""The distributed orthogonalization's platform figures and its use of JAX's mesh context.

Private imports (justified): the public plan reads the figure of this host's device only, so
the other kinds' figures are checked on the private lookup; and which mesh a split group runs
on (concrete or an abstract view) changes no public output.

``spectral_optax._distributed.execute`` reads the concrete mesh of ``jax.set_mesh`` inside ``jit``
through JAX's private ``get_concrete_mesh`` (JAX 0.10 has no public accessor there:
``jax.sharding.get_mesh`` raises under a trace); without it a split group would run on an abstract
view instead. These tests fail if that fallback is taken on the supported JAX.
"""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

import spectral_optax as so
from spectral_optax._distributed import views  # private: JAX's mesh accessor is seen by no public output
from spectral_optax._distributed.plan import default_flops_per_byte  # private: the public plan reads only this host

H100 = 989e12 / 450e9  # bfloat16 dense peak over NVLink 4 per direction (H100 / H200 SXM datasheets)
A100 = 312e12 / 300e9  # bfloat16 dense peak over NVLink 3 per direction (A100 datasheet)
V5E = 197e12 / 200e9  # bfloat16 peak over ICI per direction (Cloud TPU v5e system architecture)
V5P = 459e12 / 600e9  # bfloat16 peak over ICI per direction (Cloud TPU v5p system architecture)
CPU = 7.4e12 / 25e9  # a 96-core EPYC 9654's float32 peak over a 200 Gbit/s host NIC


def test_concrete_mesh_accessor_is_found_and_reads_set_mesh_inside_jit():
    assert views.GET_CONCRETE_MESH is not None, "the abstract-view fallback would be taken on this JAX"
    mesh = jax.make_mesh((1,), ("data",))
    seen = []

    def f(x):
        seen.append(views.concrete_mesh())
        return x

    jax.jit(f)(jnp.ones(2))
    assert seen[-1] is None or seen[-1].empty  # no context mesh: the abstract view
    with jax.set_mesh(mesh):
        jax.jit(f)(jnp.ones(3))
    assert seen[-1] == mesh and tuple(seen[-1].devices.flat) == tuple(mesh.devices.flat)
    with pytest.raises(ValueError):  # why the private accessor: the public one refuses under jit
        with jax.set_mesh(mesh):
            jax.jit(lambda x: (jax.sharding.get_mesh(), x)[1])(jnp.ones(4))


@pytest.mark.parametrize(
    "platform, kind, figure",
    [
        ("gpu", "NVIDIA H100 80GB HBM3", H100),
        ("gpu", "NVIDIA H200", H100),
        ("gpu", "NVIDIA A100-SXM4-80GB", A100),
        ("gpu", "NVIDIA RTX 6000 Ada", H100),
        ("tpu", "TPU v5 lite", V5E),
        ("tpu", "TPU v5p", V5P),
        ("tpu", "TPU v5", V5P),
        ("tpu", "TPU v4", V5P),
        ("cpu", "cpu", CPU),
    ],
)
def test_default_flops_per_byte_by_device_kind(platform, kind, figure):
    """Each device kind's figure, against the spec sheets' numbers (unknown kinds: their platform's)."""
    device = SimpleNamespace(platform=platform, device_kind=kind)
    assert default_flops_per_byte(device) == pytest.approx(figure, rel=1e-12)


def test_flops_per_byte_defaults_to_this_platform_and_steers_the_plan():
    """``None`` is the figure of ``jax.devices()[0]``; an explicit figure changes the plan: 4 squares
    of 256 x 256 on 16 devices are split (4 devices to a matrix) when collectives are cheap, and stay
    whole (12 devices idle) when a byte costs more than the flops a split saves."""
    assert default_flops_per_byte() == default_flops_per_byte(jax.devices()[0])
    tree = {f"l{i}": {"kernel": jax.ShapeDtypeStruct((256, 256), jnp.float32)} for i in range(4)}
    kw = dict(devices=16, ns_method="standard")
    (default,) = so.expert.orthogonalization_plan(tree, **kw).groups
    (same,) = so.expert.orthogonalization_plan(tree, flops_per_byte=default_flops_per_byte(), **kw).groups
    (free,) = so.expert.orthogonalization_plan(tree, flops_per_byte=0.0, **kw).groups
    (dear,) = so.expert.orthogonalization_plan(tree, flops_per_byte=1e9, **kw).groups
    assert default == same
    assert free.split == 4 and dear.split == 1 and free.flops < dear.flops, (free, dear)
