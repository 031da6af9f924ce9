"""Shared test helpers: reference comparisons at an explicit matmul precision,
and the hypothesis profiles.

On a GPU, float32 matmuls run by default at TensorFloat-32 (10 mantissa bits)
and on a TPU as one bfloat16 pass, so a float32 forward pass or training run
compared with a float64 NumPy reference at CPU tolerances (1e-5..1e-4) fails
there. Tests that compare against a float64 reference therefore run their
JAX side under ``jax.default_matmul_precision('highest')`` (the
``highest_precision`` fixture), which is true float32 on every backend and
changes nothing on a CPU.

``tf32_round`` emulates a GPU's TensorFloat-32 operand rounding on any
backend, so that CPU tests can reproduce accelerator-only failures.

Hypothesis profiles: ``ci`` (default) runs a few derandomized examples per
property, fast enough for every run; ``thorough`` (``pytest
--hypothesis-profile=thorough tests/test_properties.py``) generates >= 10,000
cases in all (the run reported in docs/reliability.md). Both use a fixed seed
(derandomize), so a failure reproduces. ``portability`` (``tools/portability.sh``,
also a CI step) is ``ci`` with the examples drawn from ``--hypothesis-seed``
instead, so a second run explores other inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=10, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "thorough", max_examples=2500, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "portability", max_examples=10, derandomize=False, deadline=None, print_blob=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci")


@pytest.fixture
def highest_precision():
    """Run the test body with float32-accurate matmuls on every backend."""
    with jax.default_matmul_precision("highest"):
        yield


def tf32_round(x):
    """Round a float32 array to TensorFloat-32 (8 exponent bits, 10 mantissa bits),
    as NVIDIA tensor cores round matmul operands at the default float32 precision
    (round to nearest on the 13 dropped bits)."""
    x = jnp.asarray(x, jnp.float32)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    bits = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)
