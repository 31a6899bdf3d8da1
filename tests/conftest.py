"""Test-suite settings.

Hypothesis runs derandomized by default, so CI sees the same examples on every run and a
red build always means a change broke something; ``--hypothesis-profile=explore`` draws
fresh random examples (run it locally and before releases to look for new failures).
Failures are never retried.

Shared fixture: ``kernel_launches`` (the NKI kernels the CPU interpreter runner launched).
"""

import os

# Under pytest-xdist every core already runs a worker: a worker's torch/OpenMP/BLAS thread
# pools would oversubscribe the cores, and their spin-waits made small tensor ops 100x
# slower (the matmul every-config battery: 164 s with the default pools, 25 s with one
# thread, same machine and load). Set before torch or numpy is imported by any test.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_pool, "1")

# No test reads or writes the user's own results or studies: the user folder
# (``$NEURON_KERNELS_PERF_RESULTS``, else ``<$XDG_CACHE_HOME or ~/.cache>/neuron-kernels``) and
# the default study storage point into one temporary cache for the run, which the xdist
# workers and every subprocess a test starts inherit. (A tuning run in the same account
# while the suite ran once changed the config ``profile`` picked between two subprocesses.)
if "NEURON_KERNELS_TEST_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["NEURON_KERNELS_TEST_CACHE"] = tempfile.mkdtemp(prefix="neuron-kernels-tests-")
    atexit.register(shutil.rmtree, os.environ["NEURON_KERNELS_TEST_CACHE"], True)
os.environ["XDG_CACHE_HOME"] = os.environ["NEURON_KERNELS_TEST_CACHE"]
for _user_setting in ("NEURON_KERNELS_PERF_RESULTS", "NEURON_KERNELS_STUDIES"):
    os.environ.pop(_user_setting, None)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

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


@pytest.fixture
def kernel_launches(monkeypatch) -> list:
    """The NKI kernels launched through the CPU interpreter runner during the test, in order
    (each still runs): an empty list means the ops ran reference math."""
    from neuron_kernels.torch_ops import routing

    calls = []
    real = routing.interpreter_runner

    def counting(kernel, *args, **kwargs):
        calls.append(kernel)
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(routing, "interpreter_runner", counting)
    return calls
