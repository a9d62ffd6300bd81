"""Regular expressions from the profiles (a smoke gate's expected reply): compiled, and refused when
they could backtrack catastrophically.

Python's ``re`` backtracks: ``(a+)+$`` against a reply of thirty ``a`` and a ``b`` tries 2**30 ways,
and the release would hang in the smoke gate. The classic causes are a quantifier inside a quantified
group where one of them is unbounded (``(a+)+``, ``(\\w*)*``, ``(x+y?)+``) and alternatives under an
unbounded repeat (``(a|aa)*``); such a pattern is refused before anything is built, naming the YAML
key. So is one that matches an empty reply (``.*``, ``x?``): a gate it guards would pass an engine that
answers nothing.
Written by hand on the parser ``re`` itself uses (so what is checked is what runs): a library that avoids backtracking (RE2) would change the syntax
the profiles use, and the ReDoS scanners on the package registry are unmaintained.
"""

from __future__ import annotations

import re
from re import _constants as C  # noqa: N812
from re import _parser as sre_parse

from .errors import InputError

MAX_PATTERN = 2048  # characters: an expected reply, not a program
REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT)


def _nested(items, outer: tuple[int, int] | None) -> str | None:
    """The first quantifier nested in a quantified group where either is unbounded; None if none."""
    for op, av in items:
        if op in REPEATS:
            lo, hi, sub = av
            if hi > 1 and outer is not None and (hi == C.MAXREPEAT or outer[1] == C.MAXREPEAT):
                return "a quantifier inside a quantified group, as in (a+)+"
            found = _nested(sub, (lo, hi) if hi > 1 else outer)
        elif op in (C.POSSESSIVE_REPEAT, C.ATOMIC_GROUP):
            found = None  # no backtracking into these: what they matched is kept
        elif op == C.SUBPATTERN:
            found = _nested(av[3], outer)
        elif op == C.BRANCH:
            if outer is not None and outer[1] == C.MAXREPEAT:
                # alternatives that can match the same text ((a|a)*, (a|aa)*) give the repeat
                # exponentially many ways to split a reply; telling overlapping ones from disjoint
                # ones is a study of its own, so every alternation under an unbounded repeat is refused
                return "an alternation inside a repeated group, as in (a|aa)*"
            found = next((f for branch in av[1] for f in [_nested(branch, outer)] if f), None)
        elif op in (C.ASSERT, C.ASSERT_NOT):
            found = _nested(av[1], outer)
        elif op == C.GROUPREF_EXISTS:
            found = _nested(av[1], outer) or (_nested(av[2], outer) if av[2] else None)
        elif op == C.GROUPREF:
            found = "a back-reference"
        else:
            found = None
        if found:
            return found
    return None


def check_regex(pattern: str, where: str, what: str = "the expected reply") -> None:
    """InputError naming ``where`` when ``pattern`` is not a regular expression, is too long, or could
    backtrack catastrophically (a nested unbounded quantifier, a back-reference)."""
    if len(pattern) > MAX_PATTERN:
        raise InputError(f"{where}: {what} is a regular expression of {len(pattern)} characters; the limit is "
                         f"{MAX_PATTERN}")
    try:
        re.compile(pattern)
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InputError(f"{where}: {what} is not a regular expression: {exc}") from None
    found = _nested(list(parsed), None)
    if not found and re.fullmatch(pattern, "") is not None:
        raise InputError(f"{where}: {what} {pattern[:80]!r} matches an empty reply, so an engine that "
                         "answers nothing would pass; write what the reply must say")
    if found:
        raise InputError(f"{where}: {what} {pattern[:80]!r} could backtrack without end ({found}); write it "
                         "without nesting or back-references, e.g. [0-9.]+ instead of ([0-9]+\\.?)+")
