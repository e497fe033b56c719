"""Shared pytest configuration: the ``gpu`` marker skips without a device;
the fuzz tests' example counts (``BLOCHSIM_FUZZ=long`` for the long run)."""
import os

import pytest

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    settings = None

if settings is not None:
    # CI: a bounded number of examples per target (all targets together take seconds), no timing assertions
    settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("long", max_examples=2000, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("BLOCHSIM_FUZZ", "ci"))


def _cuda_usable():
    try:
        import blochsim
    except ImportError:  # pragma: no cover
        return False, "blochsim is not importable"
    info = blochsim.backends()["cuda"]
    return info["available"], info["reason"]


def pytest_collection_modifyitems(config, items):
    ok, why = _cuda_usable()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"no usable CUDA device: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
