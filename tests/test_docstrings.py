"""The Examples sections of the public docstrings run and print what they show."""

import doctest
import importlib

import pytest

MODULES = [
    "skflow.gaussianizer",
    "skflow.flow_estimator._base",
    "skflow.embedder",
    "skflow.datasets._sts",
    "skflow.datasets._beir",
    "skflow.metrics",
    "skflow.synthetic",
    "skflow.flows.glow",
    "skflow.flows.optim",
    "skflow.whitening",
    "skflow.compression",
    "skflow.compression._search",
    "skflow.engines",
    "skflow.engines._engines",
    "skflow.evaluation",
    "skflow.mteb",
    "skflow.distributed",
    "skflow.persistence",
    "skflow.serving",
]


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.slow
def test_docstring_examples(name, sts_data_home, monkeypatch):
    monkeypatch.setenv("SKFLOW_DATA", str(sts_data_home))
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
