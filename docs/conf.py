"""Sphinx configuration: the Markdown pages through MyST, the API reference from the
numpydoc docstrings (autodoc + autosummary). Built by ``make docs`` with warnings as errors."""

import dask_scd

project = "dask_scd"
author = "dask_scd developers"
copyright = "dask_scd developers"
release = version = dask_scd.__version__

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
root_doc = "index"

# MyST: the pages use definition lists (`: ` lines) and link to section anchors.
myst_enable_extensions = ["deflist", "dollarmath"]
myst_heading_anchors = 4

autosummary_generate = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"  # the numpydoc sections already give the types
numpydoc_show_class_members = False  # the reference pages list members explicitly
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# No network at build time: intersphinx inventories are not fetched.
intersphinx_mapping = {}

html_theme = "alabaster"
html_title = "dask_scd"
html_static_path = []
templates_path = ["_templates"]
