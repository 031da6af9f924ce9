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
cases in all (its last run: docs/benchmarks.md). Both use a fixed seed
(derandomize), so a failure reproduces. ``portability`` (``tools/portability.sh``,
also a CI step) is ``ci`` with the examples drawn from ``--hypothesis-seed``
instead, so a second run explores other inputs.

Compile time: the suite is dominated by XLA compiles of small programs, so
it runs XLA's CPU backend at LLVM optimization level 0
(``--xla_backend_optimization_level=0``, appended to ``XLA_FLAGS`` here,
before JAX starts a backend, and passed on to the tests' subprocesses by
:func:`xla_flags`): the same HLO programs (so the same ``cost_analysis``
and collectives), compiled about 3x faster, with code that runs slower.
``SPECTRAL_OPTAX_TEST_OPT=default`` keeps XLA's own level (CI's
portability step runs that way, so both levels are exercised).
"""

from __future__ import annotations

import os

FAST_COMPILE = "--xla_backend_optimization_level=0"
if os.environ.get("SPECTRAL_OPTAX_TEST_OPT", "fast") != "default" and FAST_COMPILE not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE).strip()


def xla_flags(*extra: str) -> str:
    """This process's ``XLA_FLAGS`` (the compile level above, a portability run's
    ``--xla_cpu_max_isa``) plus ``extra``: for a test's subprocess."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), *extra]).strip()


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

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


_SLOW_TIER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_tier.txt")


def _slow_tier_ids() -> set[str]:
    with open(_SLOW_TIER) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    """Mark the measured slow tier (``tests/slow_tier.txt``) ``slow``; a stale id fails the collection."""
    ids = _slow_tier_ids()
    seen = set()
    for item in items:
        if item.nodeid in ids:
            item.add_marker(pytest.mark.slow)
            seen.add(item.nodeid)
    files = {item.nodeid.split("::")[0] for item in items}
    stale = sorted(i for i in ids - seen if i.split("::")[0] in files and not config.getoption("-k"))
    by_id = any("::" in str(a) for a in config.args)  # a selection of node ids (tools/mutation.py), not whole files
    if stale and not config.getoption("deselect") and len(files) > 1 and not by_id:
        raise pytest.UsageError(f"tests/slow_tier.txt names tests that do not exist (renamed or removed?): {stale}")
