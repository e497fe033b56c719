"""Shared pytest configuration: the ``gpu`` marker skips without a device."""
import pytest


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
