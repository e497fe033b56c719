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
    """docs/conf.py writes the API pages from each family's __all__: every
    public module of blochsim.simulators must be one of its families."""
    import ast
    import pathlib

    conf = pathlib.Path(__file__).resolve().parents[1] / "docs" / "conf.py"
    if not conf.exists():
        pytest.skip("no docs/ beside the tests")
    tree = ast.parse(conf.read_text())
    families = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FAMILIES")
    import blochsim.simulators as sims
    modules = {m.name for m in pkgutil.iter_modules(sims.__path__) if not m.name.startswith("_")}
    assert modules == {f[0] for f in families}
