"""Templates compiled once: kept in this user's own folder, and never run from a file anyone else could have put."""

from __future__ import annotations

import html as _html
import marshal
import os
import re

import jinja2
import pytest

from unibake import templates

NAME = "kit-verify.sh.j2"  # (any template: its own text is what a render gives)


@pytest.fixture
def compiled(tmp_path, monkeypatch):
    """The process's environment made anew on a cache folder of the test's; the kept compiled file of NAME,
    with what would be run from it: marshalled code rendering "PLANTED"."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    templates.environment.cache_clear()
    yield tmp_path / "cache" / "unibake" / templates.COMPILED
    templates.environment.cache_clear()


def render() -> str:
    """What NAME renders to without its values: the template's own code stops at its first value."""
    templates.environment.cache_clear()  # (a new run: nothing compiled in memory)
    try:
        return templates.environment().get_template(NAME).render()
    except jinja2.UndefinedError as exc:
        return f"the template's own: {exc}"


def plant(folder, mode: int = 0o600):
    [kept] = folder.iterdir()
    data = kept.read_bytes()
    head = data[:data.index(b"\n") + 1]
    code = templates.environment().compile("PLANTED", NAME, None)
    kept.write_bytes(head + marshal.dumps(code))
    kept.chmod(mode)
    return kept


def test_a_template_is_compiled_once_and_kept_for_this_user_alone(compiled):
    first = render()
    assert first.startswith("the template's own: ")
    [kept] = compiled.iterdir()
    assert compiled.stat().st_mode & 0o777 == 0o700 and kept.stat().st_mode & 0o777 == 0o600
    assert render() == first
    plant(compiled)
    assert render() == "PLANTED"  # (the kept file is what the next run takes: the compile it saves)


@pytest.mark.parametrize("how", ["others may write it", "a link", "another user's", "the folder others' too",
                                 "a truncated file", "another source", "another environment"])
def test_a_kept_compiled_template_anyone_else_could_have_written_is_never_run(compiled, how):
    first = render()
    kept = plant(compiled)
    if how == "others may write it":
        kept.chmod(0o620)
    elif how == "a link":
        kept.rename(compiled / "elsewhere")
        kept.symlink_to(compiled / "elsewhere")
    elif how == "another user's":
        if os.geteuid() != 0:
            pytest.skip("only root gives a file away")
        os.chown(kept, 65534, 65534)
    elif how == "the folder others' too":
        compiled.chmod(0o770)
    elif how == "a truncated file":
        kept.write_bytes(kept.read_bytes()[:-3])
    else:  # compiled from another text (the template changed since), or by another environment (unibake changed)
        data = kept.read_bytes()
        line = data.index(b"\n")
        checksum, made_by = data[line - 105:line - 65], data[line - 64:line]
        assert data[line - 65:line - 64] == b" " and all(c in b"0123456789abcdef" for c in checksum + made_by)
        kept.write_bytes(data.replace(checksum if how == "another source" else made_by, b"0" * len(
            checksum if how == "another source" else made_by), 1))
    assert render() == first


@pytest.mark.parametrize("value", ["a&b", "x<y>z", "&amp;", "p|q", "`tick`", "a`b", "<script>alert(1)</script>"])
def test_a_code_span_in_a_table_cell_shows_the_value_as_it_is(value):
    # (before: & < > were written as entities inside the span, which a code span shows as written: the notes gave
    # the env value a&b as a&amp;b, and a reader copying it took the wrong value)
    from markdown_it import MarkdownIt

    from unibake.templates import code

    html = MarkdownIt("commonmark").enable("table").render(f"| v |\n|---|\n| {code(value)} |\n")
    [cell] = re.findall(r"<td><code>(.*?)</code></td>", html, re.S)
    assert _html.unescape(cell) == value and "<script>" not in html
