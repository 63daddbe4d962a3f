"""One rule for every number that crosses a door (an option, a file, an environment variable, a
public argument): counts are whole and written in ASCII digits, reals are finite, both in range.

Python's own parsers are too kind for input: ``int("٣")`` is 3 (and MPICH's launcher dies on the
same digit), ``float("nan")`` passes every ``<= 0`` check, ``int(2.5)`` is 2. Each helper returns
the value or raises ``NumberError`` whose message names the input, the value and the rule::

    count("3", "slots", lo=1)   -> 3
    count("٣", "slots", lo=1)   NumberError: slots '٣' must be a whole number >= 1 (ASCII digits)
    positive("inf", "--lr")     NumberError: --lr 'inf' must be a finite number > 0
"""
import math
import numbers
import re
from typing import Any, Optional

__all__ = ["NumberError", "count", "real", "positive", "fraction", "count_arg", "real_arg"]

_WHOLE = re.compile(r"[+-]?[0-9]+")  # ASCII only: str.isdigit() also takes '٣' and '²'


class NumberError(ValueError):
    """A number that breaks its rule: the message names the input, the value and the rule."""


def _range(lo: Optional[float], hi: Optional[float], lo_open: bool = False,
           hi_open: bool = False) -> str:
    """'>= 1', 'from 1 to 8', 'in [0, 1)': the range in words."""
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return ""


def _fail(name: str, value: Any, rule: str) -> NumberError:
    shown = repr(value) if isinstance(value, str) else str(value)
    return NumberError(f"{name} {shown} must be {rule}".rstrip())


def count(value: Any, name: str, lo: Optional[int] = 0, hi: Optional[int] = None) -> int:
    """``value`` as a whole number in [lo, hi]: an int, a whole float, or a string of ASCII
    digits (an optional sign; no '1.5', '1e3', '1_000' or non-ASCII digits)."""
    rule = ("a whole number " + _range(lo, hi)).rstrip()
    if isinstance(value, bool):
        raise _fail(name, value, rule + " (got a bool)")
    if isinstance(value, str):
        text = value.strip()
        if not _WHOLE.fullmatch(text):
            raise _fail(name, value, rule + " (ASCII digits)")
        n = int(text)
    elif isinstance(value, numbers.Integral):
        n = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        n = int(float(value))
    else:
        raise _fail(name, value, rule)
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise _fail(name, value, rule)
    return n


def real(value: Any, name: str, lo: Optional[float] = None, hi: Optional[float] = None,
         lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a finite float in the range (nan and inf are refused, as are bools)."""
    rule = ("a finite number " + _range(lo, hi, lo_open, hi_open)).rstrip()
    if isinstance(value, bool):
        raise _fail(name, value, rule + " (got a bool)")
    try:
        x = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise _fail(name, value, rule) from None
    if not math.isfinite(x):
        raise _fail(name, value, rule)
    if lo is not None and (x <= lo if lo_open else x < lo):
        raise _fail(name, value, rule)
    if hi is not None and (x >= hi if hi_open else x > hi):
        raise _fail(name, value, rule)
    return x


def positive(value: Any, name: str) -> float:
    """``value`` as a finite float > 0 (a rate, a timeout, a size)."""
    return real(value, name, lo=0, lo_open=True)


def fraction(value: Any, name: str) -> float:
    """``value`` as a finite float in [0, 1) (a dropout rate, a held-out share)."""
    return real(value, name, lo=0, hi=1, hi_open=True)


def count_arg(value: Any, name: str, lo: Optional[int] = 0, hi: Optional[int] = None) -> int:
    """``count`` for a public argument: a str is refused too (``Linear("3", 4)`` is a bug)."""
    if isinstance(value, str):
        raise _fail(name, value, ("a whole number " + _range(lo, hi)).rstrip() + ", not a str")
    return count(value, name, lo, hi)


def real_arg(value: Any, name: str, lo: Optional[float] = None, hi: Optional[float] = None,
             lo_open: bool = False, hi_open: bool = False) -> float:
    """``real`` for a public argument: a str is refused too."""
    if isinstance(value, str):
        rule = ("a finite number " + _range(lo, hi, lo_open, hi_open)).rstrip()
        raise _fail(name, value, rule + ", not a str")
    return real(value, name, lo, hi, lo_open, hi_open)
