"""Test-suite settings.

Hypothesis runs derandomized by default, so CI sees the same examples on every run and a
red build always means a change broke something; ``--hypothesis-profile=explore`` draws
fresh random examples (run it locally and before releases to look for new failures).
Failures are never retried.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "explore",
    derandomize=False,
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci")
