"""Shared test helpers: reference comparisons at an explicit matmul precision.

On a GPU, float32 matmuls run by default at TensorFloat-32 (10 mantissa bits)
and on a TPU as one bfloat16 pass, so a float32 forward pass or training run
compared with a float64 NumPy reference at CPU tolerances (1e-5..1e-4) fails
there. Tests that compare against a float64 reference therefore run their
JAX side under ``jax.default_matmul_precision('highest')`` (the
``highest_precision`` fixture), which is true float32 on every backend and
changes nothing on a CPU.

``tf32_round`` emulates a GPU's TensorFloat-32 operand rounding on any
backend, so that CPU tests can reproduce accelerator-only failures.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest


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
