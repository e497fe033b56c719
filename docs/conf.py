"""Sphinx configuration of blochsim's documentation site.

Build: ``python -m sphinx -W -b html docs docs/_build/html`` (``pip install
".[docs]"``).  The API pages are written here from the packages' ``__all__``
at every build, so that every public name has its entry; the gallery runs
``examples/gallery/plot_*.py``.
"""
import inspect
import os
import re
import sys

# Document the installed package: run from the source folder, sys.path
# would find its blochsim/, which has no compiled extension.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]

import blochsim  # noqa: E402

project = "blochsim"
author = "the blochsim developers"
copyright = "2026, " + author
release = blochsim.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.json", "auto_examples/*.md5", "auto_examples/*.codeobj.json"]
html_theme = "pydata_sphinx_theme"
html_title = f"blochsim {release}"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
html_static_path = []

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
myst_heading_anchors = 3
# the pages include sections of the README, whose headings start at level 2
suppress_warnings = ["myst.header"]

sphinx_gallery_conf = {
    "examples_dirs": "../examples/gallery",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "abort_on_example_error": True,
    "download_all_examples": False,
    "remove_config_comments": True,
    "min_reported_time": 1,
}

# ---------------------------------------------------------------- docstrings

# Docstrings write shapes as (*voxels, samples), Python's unpacking: outside
# literals a leading '*' would open emphasis in reStructuredText.
_STAR = re.compile(r"(?<![\\*`\w])\*(?=\w)")


def _escape_stars(app, what, name, obj, options, lines):
    for i, line in enumerate(lines):
        parts = line.split("``")
        for j in range(0, len(parts), 2):
            parts[j] = _STAR.sub(r"\\*", parts[j])
        lines[i] = "``".join(parts)


def setup(app):
    app.connect("autodoc-process-docstring", _escape_stars, priority=600)


# ---------------------------------------------------------------- API pages

def _families():
    """(module name, title, intro) of each simulator family, from its
    module's docstring: "Title: what it holds." then the rest of the first
    paragraph."""
    import blochsim.simulators as sims

    out = []
    for module in sims.FAMILIES:
        first = " ".join(module.__doc__.strip().split("\n\n")[0].split())
        title, _, intro = first.partition(": ")
        out.append((module.__name__.rsplit(".", 1)[1], title, intro[:1].upper() + intro[1:]))
    return out


FAMILIES = _families()


def _entries(module_name, names, doc_module=None):
    """autodoc directives for ``names`` of ``module_name``."""
    module = __import__(module_name, fromlist=["_"])
    out = [f".. currentmodule:: {doc_module or module_name}", ""]
    for name in names:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            out += [f".. autoclass:: {name}", "   :members:", ""]
        elif callable(obj):
            out += [f".. autofunction:: {name}", ""]
        else:  # documented where it is defined, with its #: comment
            out += [f".. autodata:: {_defined_in(name, module)}.{name}", "   :no-value:", ""]
    return out


_DATA_HOMES = ("blochsim._engine.pools", "blochsim.sequence.operators", "blochsim.pulseq.dephasing", "blochsim.phantom")


def _defined_in(name, module):
    """The module whose source assigns ``name`` at the top level."""
    for home in (module.__name__,) + _DATA_HOMES:
        m = __import__(home, fromlist=["_"])
        try:
            source = inspect.getsource(m)
        except (OSError, TypeError):
            continue
        if re.search(rf"^{name}\s*[:=]", source, re.M):
            return home
    return module.__name__


def _page(path, title, intro, body):
    with open(path, "w") as f:
        f.write("\n".join([title, "=" * len(title), "", intro, ""] + body) + "\n")


def _write_api(root):
    api = os.path.join(root, "api")
    os.makedirs(api, exist_ok=True)
    pages = []
    core = ["Simulator", "ClosedFormSimulator", "ModelOperator", "backends", "lineshape", "power_factor",
            "DeviceArray", "CudaError", "get_include", "get_pkgconfig_dir", "POOL_PROPERTIES"]
    _page(os.path.join(api, "core.rst"), "Simulators: the base classes",
          "The base classes every simulator derives from (their ``simulate``, ``jacobian``, ``vjp`` and "
          "``jacobian_vjp``), the backends, and the names ``import blochsim`` gives.", _entries("blochsim", core))
    pages.append("core")
    for family, title, intro in FAMILIES:
        module = __import__(f"blochsim.simulators.{family}", fromlist=["_"])
        _page(os.path.join(api, f"{family}.rst"), title,
              intro + f" Importable from ``blochsim.simulators`` (module ``blochsim.simulators.{family}``).",
              _entries(f"blochsim.simulators.{family}", module.__all__, "blochsim.simulators"))
        pages.append(family)
    import blochsim.sequence as seq
    _page(os.path.join(api, "sequence.rst"), "Operators and sequences",
          "The operators a custom :class:`blochsim.Simulator` builds its sequence from, pulse design, "
          "and the packed event stream (also importable from ``blochsim``).", _entries("blochsim.sequence", seq.__all__))
    import blochsim.pulseq as pq
    _page(os.path.join(api, "pulseq.rst"), "Pulseq files", "Reading Pulseq and pulseq-cest files.",
          _entries("blochsim.pulseq", pq.__all__))
    import blochsim.estimators as est
    _page(os.path.join(api, "estimators.rst"), "Estimators", "From signals to parameter maps.",
          _entries("blochsim.estimators", est.__all__))
    _page(os.path.join(api, "optim.rst"), "Protocol design and steady states",
          "Fisher information, Cramér–Rao bounds and sequence design (``blochsim.optim``); the exact periodic "
          "steady state (``blochsim.steady``); the numerical phantom (``blochsim.phantom``); tissue presets "
          "(``blochsim.presets``).",
          _entries("blochsim.optim", _public("blochsim.optim")) + _entries("blochsim.steady", _public("blochsim.steady"))
          + _entries("blochsim.phantom", ["TISSUES", "brain_phantom"])
          + _entries("blochsim.presets", _public("blochsim.presets")))
    _page(os.path.join(api, "distributed.rst"), "Dask", "Lazy simulation and estimation on a Dask scheduler "
          "(``pip install \"blochsim[distributed]\"``); see :doc:`../cluster`.",
          _entries("blochsim.distributed", ["lazy_call", "tree_sum"]))
    _page(os.path.join(api, "subspace.rst"), "Temporal subspaces",
          "Low-rank bases of signal evolutions, their projections, and BART's ``.cfl`` files "
          "(``blochsim.subspace``).", _entries("blochsim.subspace", _public("blochsim.subspace")))
    pages += ["sequence", "pulseq", "estimators", "optim", "subspace", "distributed"]
    _page(os.path.join(api, "index.rst"), "API reference", "Every public simulator, operator, estimator and "
          "function, by family.", [".. toctree::", "   :maxdepth: 1", ""] + [f"   {p}" for p in pages])


def _public(module_name):
    module = __import__(module_name, fromlist=["_"])
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", None)
                 == module_name and (inspect.isclass(v) or inspect.isfunction(v))]
    return names


_write_api(os.path.dirname(os.path.abspath(__file__)))
