"""Checking a reader's exercise answers against the run they are reading.

Each chapter's exercises end in a cell where the reader types answers (every one starts as
None) and runs it. `check` prints one line per answer: "no answer yet" while it is None (the
run's value stays hidden, so the cell never gives the answer away), else "right" or "wrong"
with the run's own value beside it. What counts as right is a `match` function: equality by
default, `near(rel)` for a measured number, `within(abs_)` for a computed one, `one_of` when
the run's value is a list of right answers.
"""
from __future__ import annotations

import math
from typing import Any, Callable

Match = Callable[[Any, Any], bool]


def equal(mine, right) -> bool:
    return mine == right


def near(rel: float) -> Match:
    """Right when within rel (a fraction) of the run's value: for measured numbers."""
    if not rel > 0:
        raise ValueError(f"near(rel={rel!r}): rel must be a positive fraction")

    def match(mine, right) -> bool:
        return _number(mine) and abs(mine - right) <= rel * abs(right)
    return match


def within(abs_: float) -> Match:
    """Right when within abs_ of the run's value: for a number read off a scan or a formula."""
    if not abs_ >= 0:
        raise ValueError(f"within(abs_={abs_!r}): abs_ must be non-negative")

    def match(mine, right) -> bool:
        return _number(mine) and abs(mine - right) <= abs_
    return match


def one_of(mine, rights) -> bool:
    """Right when the answer is any of several right ones (the run's value is that list)."""
    return mine in rights


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def verdict(mine, right, match: Match = equal) -> str:
    """'no answer yet', 'right' or 'wrong' (a malformed answer is wrong, never an error)."""
    if mine is None:
        return "no answer yet"
    try:
        return "right" if match(mine, right) else "wrong"
    except (TypeError, ValueError):
        return "wrong"


def check(name: str, mine, right, match: Match = equal, shown: str | None = None) -> None:
    """Print one exercise's line: its verdict, and the run's value once an answer is given.

    `shown` is how the run's value is printed (default: repr, or 3 decimals for a float).
    Returns nothing, so a notebook cell that ends in a check shows the line only."""
    said = verdict(mine, right, match)
    if said == "no answer yet":
        line = f"{name}: {said}"
    else:
        value = shown if shown is not None else (f"{right:.3f}" if isinstance(right, float)
                                                 else repr(right))
        line = f"{name}: {said} (yours {mine!r}, this run's {value})"
    print(line)
