"""The Examples sections of the installed package's docstrings run and
print what they say."""
import doctest
import importlib
import pkgutil

import pytest

import blochsim

MODULES = ["blochsim"] + sorted(
    m.name for m in pkgutil.walk_packages(blochsim.__path__, prefix="blochsim.")
    if not any(part.startswith("_") for part in m.name.split(".")[1:]))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
