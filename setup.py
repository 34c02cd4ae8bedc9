"""A thin shim: the project's metadata, extras and console script are in pyproject.toml."""

from setuptools import setup

setup()
