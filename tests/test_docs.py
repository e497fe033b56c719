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


def test_every_simulator_family_has_an_api_page():
    """docs/conf.py writes an API page for each module of
    blochsim.simulators.FAMILIES, titled from its docstring: every public
    module of blochsim.simulators must be one of them, with a docstring
    "Title: what it holds."."""
    import blochsim.simulators as sims
    modules = {m.name for m in pkgutil.iter_modules(sims.__path__) if not m.name.startswith("_")}
    assert modules == {f.__name__.rsplit(".", 1)[1] for f in sims.FAMILIES}
    for family in sims.FAMILIES:
        title, colon, intro = family.__doc__.strip().split("\n\n")[0].partition(": ")
        assert colon and title and intro, family.__name__
