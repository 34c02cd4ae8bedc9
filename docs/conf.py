"""Sphinx configuration of skflow's documentation: the API reference from the numpydoc docstrings, and the
narrative pages (``docs/*.md``, read by MyST where they are, so their links work on GitHub too).

Build it with warnings as errors (CONTRIBUTING.md)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

import importlib
import inspect
import os
import shutil
import sys

sys.path.insert(0, os.path.abspath(".."))  # the checkout's skflow, as the tests import it

import skflow  # noqa: E402

project = "skflow"
author = "the skflow developers"
copyright = "the skflow developers"  # noqa: A001 (Sphinx's name)
version = release = skflow.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
# figures/anisotropy.md is the data of a figure that results.md shows, not a page
exclude_patterns = ["_build", "figures/*.md"]

# Docstrings: numpydoc sections; one page per public name (api.rst lists them, autosummary writes the stubs).
autosummary_generate = True
# The stubs are written anew each build, so a name that left an __all__ leaves no stale page (a warning) behind.
shutil.rmtree(os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated"), ignore_errors=True)
autosummary_imported_members = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # numpydoc's Parameters section says the types
numpydoc_show_class_members = False  # the class template lists the methods
numpydoc_class_members_toctree = False
default_role = "py:obj"  # `Name` in a docstring links to its page where it has one

# The Markdown pages: GitHub's heading anchors (links such as embedder.md#prompts), $...$ left as text.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]


def _foreign(app, what, name, obj, skip, options):
    """Leave out of a class's page what skflow does not define or document: scikit-learn's, PyTorch's and
    sentence-transformers' methods (their docstrings link to their own sites), and a skflow override whose only
    docstring is a base class's from elsewhere."""
    if what != "class":
        return None
    target = inspect.unwrap(getattr(obj, "fget", None) or getattr(obj, "__func__", obj))
    module = getattr(target, "__module__", None) or ""
    if not module.startswith("skflow"):
        return True
    if getattr(target, "__doc__", None) is None:
        owner = sys.modules[module]
        for part in target.__qualname__.split(".")[:-1]:
            owner = getattr(owner, part, None)
        for base in getattr(owner, "__mro__", ())[1:]:
            if getattr(vars(base).get(name), "__doc__", None):
                return None if base.__module__.startswith("skflow") else True
    return None


def _not_offered(cls) -> list[str]:
    """The methods ``cls`` never offers, though its class has them: scikit-learn's ``available_if`` (a class-level
    lookup finds the method whatever the check says: it is asked of the class here) and ``inverse_transform`` of a
    projection (``_invertible = False``). Their pages would document what every instance lacks."""
    hidden = []
    for name in ("partial_fit", "score", "score_samples", "inverse_transform"):
        member = next((vars(base)[name] for base in cls.__mro__ if name in vars(base)), None)
        check = getattr(member, "check", None)
        if (check is not None and not check(cls)) or (isinstance(member, property) and name == "inverse_transform"
                                                      and getattr(cls, "_invertible", True) is False):
            hidden.append(name)
    return hidden


# The class template's exclude-members, by the page's full name (skflow's classes that have some to leave out).
autosummary_context = {"not_offered": {
    f"{module.__name__}.{name}": ", ".join(hidden)
    for module in (importlib.import_module(m) for m in ("skflow", "skflow.compression", "skflow.whitening"))
    for name in module.__all__ if inspect.isclass(cls := getattr(module, name)) and (hidden := _not_offered(cls))}}


def _no_type_docstring(app, what, name, obj, options, lines):
    """A constant's page: its value, not the docstring of its type (tuple's, dict's)."""
    type_doc = (type(obj).__doc__ or "").strip().splitlines()
    if what == "data" and type_doc and any(type_doc[0].strip() in line for line in lines):
        lines.clear()


def setup(app):
    app.connect("autodoc-skip-member", _foreign)
    app.connect("autodoc-process-docstring", _no_type_docstring, priority=400)  # before numpydoc's


html_theme = "pydata_sphinx_theme"
html_title = f"skflow {release}"
html_theme_options = {
    "navbar_end": ["navbar-icon-links"],
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
html_copy_source = False
