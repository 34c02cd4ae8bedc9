"""The one reader of numbers written as text (`skflow.utils.ascii_number`): the options, the STS and BEIR scores and
the Ray port all read through it, so ``int()`` and ``float()`` never take another script's digits for a number."""

import math

import pytest

from skflow.utils import ascii_number

_NAN = object()


@pytest.mark.parametrize(("text", "as_int", "as_float", "as_digits"), [
    ("12", 12, 12.0, 12),
    ("0", 0, 0.0, 0),
    ("٣", None, None, None),  # Arabic-Indic three: int() and float() read it
    ("３", None, None, None),  # fullwidth three
    ("𝟓", None, None, None),  # mathematical bold five
    ("1٣", None, None, None),
    ("+1", 1, 1.0, None),  # what int() and float() read in ASCII stays theirs; digits: 0-9 only
    (" 1", 1, 1.0, None),
    ("1 ", 1, 1.0, None),
    ("1_000", 1000, 1000.0, None),
    ("-0", 0, -0.0, None),
    ("-5", -5, -5.0, None),
    ("", None, None, None),
    (" ", None, None, None),
    ("1e3", None, 1000.0, None),
    ("1.5", None, 1.5, None),
    ("nan", None, _NAN, None),
    ("inf", None, math.inf, None),
    ("0x10", None, None, None),
    ("--1", None, None, None),
], ids=ascii)
def test_ascii_number_reads_ascii_only(text, as_int, as_float, as_digits):
    assert ascii_number(text) == as_int and type(ascii_number(text)) is type(as_int)
    got = ascii_number(text, float)
    assert math.isnan(got) if as_float is _NAN else (got == as_float and type(got) is type(as_float))
    assert ascii_number(text, digits=True) == as_digits
    assert ascii_number(text, float, digits=True) == (None if as_digits is None else float(as_digits))


def test_ascii_number_of_many_digits():
    many = "9" * 5000
    assert ascii_number(many) is None and ascii_number(many, digits=True) is None  # int() refuses 4300 digits
    assert ascii_number(many, float, digits=True) == math.inf  # float() reads any length
    assert ascii_number("1" + "0" * 30, digits=True) == 10**30
