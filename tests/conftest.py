"""Shared pytest configuration: hypothesis profiles.

``ci`` (default): a few derandomized examples per property, fast enough for
every run. ``thorough``: ``pytest --hypothesis-profile=thorough
tests/test_properties.py`` generates >= 10,000 cases in all (the run reported
in docs/reliability.md). Both use a fixed seed (derandomize), so a failure
reproduces.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=10, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", max_examples=2500, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci")
