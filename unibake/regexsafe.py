"""Regular expressions from the profiles (a smoke gate's expected reply, a sanitisation allow pattern):
compiled, and refused when they could backtrack catastrophically.

Python's ``re`` backtracks: ``(a+)+$`` against a reply of thirty ``a`` and a ``b`` tries 2**30 ways,
and the release would hang. The time goes to the ways one pattern can match one text, so each part of a
pattern is measured by them: a repeated part that can match a text in more than one way (a quantifier
inside it, ``(a+)+``, ``(x+y?)+``, ``(\\w*)*``; alternatives that can start alike, ``(a|aa)*``, alike
meaning that no place among their first characters tells them apart: ``tp1|tp2`` differ at the third, so
``(?:tp1|tp2)+`` is taken; an optional part, ``(a?){30}``) multiplies them at each repeat, and varying parts in a row that can take
each other's characters (``a?a?a?aaa``) multiply them too. A pattern whose parts could match one text
in more than ``MAX_WAYS`` ways, or that repeats without bound a part that can match in more than one
(or repeats at all one with an unbounded quantifier of its own), is refused before anything is built,
naming the YAML key. A varying part followed by a character it cannot match (``\\d{1,3}\\.``,
``[a-z]+-``) ends where that character is, so it adds no ways. What stays are polynomial shapes
(``.* a .* b``): the smoke gate matches in a child process stopped after 10 s, and an allow pattern is
searched in what the sanitisation gate found in a child process stopped after 10 s too (``sanitise.allowed``). A smoke reply that matches an
empty reply (``.*``, ``x?``) is refused as well: a gate it guards would pass an engine that answers
nothing.
Written by hand on the parser ``re`` itself uses (so what is checked is what runs): a library that avoids
backtracking (RE2) would change the syntax the profiles use, and the ReDoS scanners on the package
registry are unmaintained.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from re import _constants as C  # noqa: N812
from re import _parser as sre_parse

from .errors import InputError

MAX_PATTERN = 2048  # characters: an expected reply, not a program
MAX_WAYS = 10_000  # ways one text can be matched: (a?){14} takes milliseconds, each more optional doubles it
MANY = 64  # a bounded repeat of more choices than this counts as an unbounded one
REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT)
TOP = 0x10FFFF
ANY = None  # a character set that may hold any character

NESTED = "a quantifier inside a quantified group, as in (a+)+"
ALTERNATION = "an alternation inside a repeated group, as in (a|aa)*"
# sound supersets of re's classes on str patterns (Unicode digits, letters, spaces are all beyond ASCII)
CATEGORIES = {C.CATEGORY_DIGIT: ((0x30, 0x39), (0x80, TOP)),
              C.CATEGORY_WORD: ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A), (0x80, TOP)),
              C.CATEGORY_SPACE: ((0x09, 0x0D), (0x1C, 0x20), (0x80, TOP))}


class _Refused(Exception):
    pass


@dataclass(frozen=True)
class _Shape:
    ways: int = 1  # how many ways the part can match one text (capped just above MAX_WAYS)
    unbounded: bool = False  # holds a quantifier whose choices grow with the text
    alternation: bool = False  # some of its ways come from alternatives that can start alike
    nullable: bool = False  # can match an empty text
    empty_only: bool = False  # matches nothing but an empty text (an anchor, a lookaround)
    first: tuple | None = ()  # the characters a non-empty match can start with (ANY: any)
    single: bool = False  # matches exactly one character, one of ``first``
    spread: tuple | None | bool = False  # a varying repeat of one character: the characters it takes
    # it ends in such a repeat, whose end what follows decides (``tail``: its characters); ``settled``: the
    # rest of it matches one text in one way, bounded (as \.[0-9]+ does, so (?:\.[0-9]+)* splits one way)
    tail: tuple | None | bool = False
    settled: bool = False
    # the characters of every match's first few characters, one set each (a sound superset): two alternatives
    # whose sets differ at some place cannot both match past it, as (?:bar|baz) cannot
    prefix: tuple = ()


def _distinct(a: _Shape, b: _Shape) -> bool:
    """Whether no text starts with what both ``a`` and ``b`` match: at one of the first places, their
    characters differ."""
    return any(not _overlap(x, y) for x, y in zip(a.prefix, b.prefix))


def _overlap(a, b) -> bool:
    if a is ANY or b is ANY:
        return a != () and b != ()
    return any(lo <= h and l2 <= hi for lo, hi in a for l2, h in b)


def _union(a, b):
    return ANY if a is ANY or b is ANY else a + b


def _cap(n: int) -> int:
    return min(n, MAX_WAYS + 1)


def _charset(items, fold: bool):
    out: tuple = ()
    for op, av in items:
        if op == C.LITERAL and not fold:
            out += ((av, av),)
        elif op == C.RANGE and not fold:
            out += (av,)
        elif op == C.CATEGORY and av in CATEGORIES:
            out += CATEGORIES[av]
        else:  # a negation, a case-folded letter, a negated class: any character, to be safe
            return ANY
    return out


def _seq(items, fold: bool) -> _Shape:
    shapes = [_node(op, av, fold) for op, av in items]
    ways, unbounded, first, nullable = 1, False, (), True
    last = max((k for k, s in enumerate(shapes) if not s.empty_only), default=-1)
    tail, settled = False, False
    for k, s in enumerate(shapes):
        after = next((t for t in shapes[k + 1:] if not t.empty_only), None)
        if k == last and s.spread is not False:
            tail, settled = s.spread, ways == 1 and not unbounded
        elif k == last:  # a group last (a capturing one is not unwrapped): its own last run, as the group says it
            tail, settled = s.tail, s.settled and ways == 1 and not unbounded
        # a varying run of one character set, then a part that cannot start with one of them: the run ends
        # where that part starts, whatever it tried first, so its choices add time but multiply no ways
        if s.spread is not False and after is not None and not after.nullable and not _overlap(s.spread, after.first):
            continue
        ways, unbounded = _cap(ways * s.ways), unbounded or s.unbounded
        if ways > MAX_WAYS:
            raise _Refused(f"varying parts that can match one text in more than {MAX_WAYS} ways, as in a?a?a?aaa")
    for s in shapes:
        if nullable:
            first = _union(first, s.first)
        nullable = nullable and s.nullable
    alone = [s for s in shapes if not s.empty_only]
    prefix: tuple = ()
    for s in alone:  # the single characters it starts with, then the first part's own prefix
        if not s.single:
            prefix += s.prefix
            break
        prefix += (s.first,)
    return _Shape(ways=ways, unbounded=unbounded, alternation=any(s.alternation for s in shapes), nullable=nullable,
                  empty_only=not alone, first=first,
                  single=len(alone) == 1 and alone[0].single,
                  spread=alone[0].spread if len(alone) == 1 and len(shapes) == 1 else False,
                  tail=tail, settled=settled, prefix=prefix)


def _alternatives(branches: list[_Shape]) -> _Shape:
    # alternatives no two of which can start alike: at most one of them gets past its first character (or
    # past the first place where their characters differ: bar|baz)
    alike = any(a.nullable or b.nullable or _overlap(a.first, b.first) and not _distinct(a, b)
                for i, a in enumerate(branches) for b in branches[i + 1:])
    first: tuple | None = ()
    for b in branches:
        first = _union(first, b.first)
    prefix = branches[0].prefix[:min(len(b.prefix) for b in branches)]
    for b in branches[1:]:
        prefix = tuple(_union(x, y) for x, y in zip(prefix, b.prefix))
    return _Shape(ways=_cap(sum(b.ways for b in branches) if alike else max(b.ways for b in branches)),
                  unbounded=any(b.unbounded for b in branches),
                  alternation=alike or any(b.alternation for b in branches),
                  nullable=any(b.nullable for b in branches), empty_only=all(b.empty_only for b in branches),
                  first=first, single=all(b.single for b in branches), prefix=prefix)


def _repeat(lo: int, hi: int, body: _Shape) -> _Shape:
    if hi == 0:
        return _Shape(nullable=True, empty_only=True)
    if body.empty_only:  # a lookaround or an anchor made optional: taken or not, two ways to match the same text
        return _Shape(ways=1 if lo else 2, nullable=True, empty_only=True)
    unbounded = hi == C.MAXREPEAT
    if hi == 1:
        ways = body.ways if lo == 1 else _cap(body.ways + 1)
        return _Shape(ways=ways, unbounded=body.unbounded, alternation=body.alternation,
                      nullable=lo == 0 or body.nullable, first=body.first, single=body.single and lo == 1,
                      spread=body.first if body.single and lo == 0 else False)
    if body.settled and not body.nullable and not _overlap(body.tail, body.first):
        # each copy's last run stops where the next copy starts, at a character the run cannot take: one way
        return _Shape(unbounded=True, nullable=lo == 0, first=body.first)
    if body.unbounded:  # (a+)+, (a*){2}: the text split among the copies in ever more ways
        raise _Refused(NESTED)
    if body.ways > 1 or body.nullable:  # each copy can match in several ways (or none): they multiply
        if unbounded or hi > MANY:
            raise _Refused(ALTERNATION if body.alternation else NESTED)
        per = max(body.ways, 2 if body.nullable else 1)
        ways = _cap(per ** min(hi, 64))
        if ways > MAX_WAYS:
            raise _Refused(f"a part repeated {hi} times that can match one text in more than {MAX_WAYS} ways, "
                           "as in (a?){30}")
        return _Shape(ways=ways, alternation=body.alternation, nullable=lo == 0 or body.nullable, first=body.first)
    choices = C.MAXREPEAT if unbounded else hi - lo + 1
    many = choices > MANY
    return _Shape(ways=1 if many else _cap(choices), unbounded=many, nullable=lo == 0, first=body.first,
                  spread=body.first if body.single and choices > 1 else False)


def _node(op, av, fold: bool) -> _Shape:
    if op == C.LITERAL:
        return _Shape(first=ANY if fold else ((av, av),), single=True, prefix=(ANY if fold else ((av, av),),))
    if op == C.IN:
        return _Shape(first=_charset(av, fold), single=True, prefix=(_charset(av, fold),))
    if op in (C.ANY, C.NOT_LITERAL):
        return _Shape(first=ANY, single=True, prefix=(ANY,))
    if op == C.AT:
        return _Shape(nullable=True, empty_only=True)
    if op in (C.ASSERT, C.ASSERT_NOT):
        _seq(av[1], fold)  # tried at every position it is reached: held to the same rule, its ways its own
        return _Shape(nullable=True, empty_only=True)
    if op == C.SUBPATTERN:
        _, add, drop, sub = av
        return _seq(sub, (fold or bool(add & C.SRE_FLAG_IGNORECASE)) and not drop & C.SRE_FLAG_IGNORECASE)
    if op == C.ATOMIC_GROUP:
        inner = _seq(av, fold)  # what it matched is kept: one way, whatever it tried inside
        return _Shape(nullable=inner.nullable, empty_only=inner.empty_only, first=inner.first, single=inner.single)
    if op == C.POSSESSIVE_REPEAT:
        lo, hi, sub = av
        inner = _repeat(lo, hi, _seq(sub, fold))
        return _Shape(nullable=inner.nullable, empty_only=inner.empty_only, first=inner.first)
    if op in REPEATS:
        lo, hi, sub = av
        return _repeat(lo, hi, _seq(sub, fold))
    if op == C.BRANCH:
        return _alternatives([_seq(b, fold) for b in av[1]])
    if op == C.GROUPREF_EXISTS:
        _, yes, no = av
        return _alternatives([_seq(yes, fold), _seq(no, fold) if no else _Shape(nullable=True, empty_only=True)])
    if op == C.GROUPREF:
        raise _Refused("a back-reference")
    return _Shape(nullable=True, first=ANY)  # anything else: taken as the loosest part


def backtracks(pattern: str) -> str | None:
    """Why ``pattern`` (a valid regular expression) could backtrack catastrophically; None if it cannot."""
    parsed = sre_parse.parse(pattern)
    try:
        _seq(list(parsed), bool(parsed.state.flags & C.SRE_FLAG_IGNORECASE))
    except _Refused as exc:
        return str(exc)
    except RecursionError:
        return "groups nested too deeply to check"
    return None


def check_regex(pattern: str, where: str, what: str = "the expected reply") -> None:
    """InputError naming ``where`` when ``pattern`` is not a regular expression, is too long, matches an
    empty reply or could backtrack catastrophically (see the module's docstring)."""
    if len(pattern) > MAX_PATTERN:
        raise InputError(f"{where}: {what} is a regular expression of {len(pattern)} characters; the limit is "
                         f"{MAX_PATTERN}")
    try:
        re.compile(pattern)
        found = backtracks(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InputError(f"{where}: {what} is not a regular expression: {exc}") from None
    if found:
        raise InputError(f"{where}: {what} {pattern[:80]!r} could backtrack without end ({found}); write it "
                         "without nesting or back-references, e.g. [0-9.]+ instead of ([0-9]+\\.?)+")
    if re.fullmatch(pattern, "") is not None:
        raise InputError(f"{where}: {what} {pattern[:80]!r} matches an empty reply, so an engine that "
                         "answers nothing would pass; write what the reply must say")
