"""The Examples sections of the public docstrings run and print what they show."""

import doctest
import importlib

import pytest

MODULES = ["skflow.gaussianizer", "skflow.metrics", "skflow.synthetic", "skflow.flows.glow"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
