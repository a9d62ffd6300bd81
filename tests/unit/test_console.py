"""What the reader of a run sees: plain lines in logs, bars on a terminal, 80 columns, --quiet, NO_COLOR."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pytest

from unibake.console import Reporter

DIGEST = "sha256:" + "ab" * 32


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_summary_fits_80_columns_and_keeps_digests_whole():
    out = io.StringIO()
    reporter = Reporter(env={}, stream=out)
    with reporter.stage("archive", "demo:1 -> demo-1.tar.zst"):
        pass
    reporter.summary("unibake: released", [("image", "demo:1"), ("image ID", DIGEST)], "released demo:1")
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert f"    {DIGEST}" in lines and lines[-1] == "released demo:1"


def test_quiet_leaves_only_the_final_line_and_warnings():
    out = io.StringIO()
    reporter = Reporter(env={}, stream=out, quiet=True)
    with reporter.stage("build"):
        reporter.info("noise")
        reporter.build_line("Step 1/2 : FROM x")
    reporter.table("t", ["a"], [["b"]])
    reporter.warn("careful")
    reporter.summary("title", [("k", "v")], "done")
    assert out.getvalue() == "warning: careful\ndone\n"


def test_plain_output_prints_progress_lines_not_bars(monkeypatch):
    out = io.StringIO()
    reporter = Reporter(env={"CI": "true"}, stream=out)
    clock = iter([0.0, 6.0, 12.0])
    monkeypatch.setattr("unibake.console.time.monotonic", lambda: next(clock))
    with reporter.progress("archive", 4 << 30) as advance:
        advance(1 << 30)
        advance(1 << 30)
    text = out.getvalue()
    assert "archive: 1.00 GiB of 4.00 GiB" in text and "\x1b[" not in text


def test_a_terminal_gets_bars_and_colour_unless_no_color():
    screen = Terminal()
    reporter = Reporter(env={}, stream=screen)
    assert not reporter.plain and not reporter.console.no_color
    reporter.build_line("Step 1/3 : FROM base")
    reporter.build_line(" ---> 1234567890ab")
    reporter.build_line("Step 2/3 : RUN make")
    with reporter.stage("build"):
        pass
    with reporter.progress("archive", 100) as advance:
        advance(50)
    reporter.table("releases", ["release", "state"], [["1.3.1", "verifies"]])
    reporter.summary("unibake: built", [("image", "demo:1")], "built demo:1")
    assert "Step 2/3 : RUN make" in screen.getvalue() and "verifies" in screen.getvalue()
    assert "\x1b[" in screen.getvalue() and "━" in screen.getvalue()  # colour, and the progress bar drawn
    assert Reporter(env={"NO_COLOR": "1"}, stream=Terminal()).console.no_color


@pytest.mark.parametrize("said", ["ld: cannot find [/opt/lib/libfoo.so]", "[/]", "[link=http://x.invalid]here[/link]"])
def test_a_build_line_holding_rich_markup_is_shown_as_text_and_the_build_error_stays_the_error(said):
    # on a terminal the build's last line is the bar's text: read as markup, "[/opt/lib]" was a MarkupError as the
    # stage ended, which took the place of the build's own error (a traceback, not "error: ... Step N")
    screen = Terminal()
    reporter = Reporter(env={}, stream=screen)
    with pytest.raises(LookupError, match="the build failed at Step 2"):
        with reporter.stage("build"):
            reporter.build_line("Step 2/3 : RUN make")
            reporter.build_line(said)
            with reporter.progress(said, 10) as advance:
                advance(5)
            raise LookupError("the build failed at Step 2")
    assert "x.invalid" not in screen.getvalue().replace(said, "") and "MarkupError" not in screen.getvalue()

def test_a_table_cell_from_outside_cannot_forge_a_line_drive_the_terminal_or_carry_markup(cli, tmp_path):
    # releases lists folders by name: a name is anyone's to choose
    out = tmp_path / "release"
    for name in ("x\nerror: forged", "y\x1b[2J\x1b[31m", "[bold red]z[/] [oops]"):
        (out / name).mkdir(parents=True)
        (out / name / "manifest.json").write_text("not JSON\n")
    plain = cli("releases", "--out", str(out))
    assert plain.error_lines == [] and "\x1b" not in plain.err
    terminal = Terminal()
    Reporter(env={}, stream=terminal).table("releases", ["release"], [["[bold red]z[/] [oops]"], ["y\x1b[2J"]])
    shown = terminal.getvalue()
    assert "[bold red]z[/] [oops]" in shown and "\x1b[2J" not in shown  # markup shown as text, not obeyed


def test_a_line_from_outside_shows_no_character_that_reorders_or_hides_the_text_around_it():
    # a bidi override shows "run<U+202E>hs.txt" as "runtxt.sh"; a byte-order mark, a zero-width space, a line
    # separator or a tag character show as nothing; the joiners emoji and scripts need stay, as do accents
    out = Terminal()
    Reporter(env={"CI": "1"}, stream=out).warn("run\u202ehs.txt \ufeff\u200b\u2028\U000e0041 \U0001f469\u200d\U0001f52c caf\u00e9")
    assert out.getvalue() == ("warning: run\\u202ehs.txt \\ufeff\\u200b\\u2028\\U000e0041 "
                              "\U0001f469\u200d\U0001f52c caf\u00e9\n")


def test_a_lone_surrogate_no_file_name_could_hold_is_shown_escaped_not_a_traceback():
    # "\ud800" (from a JSON "\\ud800") is no byte a file system gave: surrogateescape cannot write it, and
    # visible_name raised UnicodeEncodeError, a traceback wherever one_line showed it
    from unibake.console import one_line
    from unibake.files import visible_name

    assert visible_name("caf\udce9") == "caf\\xe9"
    assert visible_name("bad\ud800name") == "bad\\ud800name"
    assert visible_name("bad\ud800 caf\udce9") == "bad\\ud800 caf\\udce9"
    assert "\\ud800" in one_line("release \ud800 broken")


def test_a_counter_prints_lines_on_a_terminal_too_and_from_several_threads_at_once(monkeypatch):
    # deploy's engines load at once, each with a counter that prints a line every few seconds naming its engine,
    # on a terminal as in a log
    import itertools
    import threading

    screen = Terminal()
    reporter = Reporter(env={}, stream=screen)
    assert not reporter.plain
    clock = itertools.count(0.0, 6.0)
    monkeypatch.setattr("unibake.console.time.monotonic", lambda: next(clock))
    counters = [reporter.counter(f"tcp://{n}:2375: load", 4 << 30) for n in "ab"]
    threads = [threading.Thread(target=lambda c=c: [c(1 << 30) for _ in range(2)]) for c in counters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    text = screen.getvalue()
    for n in "ab":
        assert f"tcp://{n}:2375: load: 1.00 GiB of 4.00 GiB" in text and f"tcp://{n}:2375: load: 2.00 GiB" in text
    quiet = Reporter(env={}, stream=Terminal(), quiet=True)
    quiet.counter("load", 10)(10)
    assert quiet.console.file.getvalue() == ""



def test_a_counter_whose_first_bytes_come_late_counts_its_rate_from_them_not_from_its_start(monkeypatch):
    # a --stage build's normalise waits 7 s for the engine's first byte (its export writes its temporary folder
    # first): its first line said "0.00 GiB of 1.21 GiB, 0 MiB/s, about 35846 s left"
    out = io.StringIO()
    reporter = Reporter(env={"CI": "true"}, stream=out)
    clock = iter([0.0, 7.0, 12.0, 17.0])
    monkeypatch.setattr("unibake.console.time.monotonic", lambda: next(clock))
    with reporter.progress("normalise", 1 << 30) as advance:
        advance(512)
        advance(1 << 28)
        advance(1 << 28)
    assert out.getvalue().splitlines() == [
        "    normalise: 0.00 GiB of 1.00 GiB, the first bytes after 7 s",
        "    normalise: 0.25 GiB of 1.00 GiB, 51 MiB/s, about 15 s left",
        "    normalise: 0.50 GiB of 1.00 GiB, 51 MiB/s, about 10 s left"]


def test_a_counter_past_its_expected_total_says_so_not_a_share_over_the_whole(monkeypatch):
    # a total is an estimate where the bytes counted are a stream's (normalise counts the engine's save, a little
    # longer than the image's size): past it, lines said "2.00 GiB of 1.00 GiB, about 0 s left" and a bar 200 %
    import itertools

    out = io.StringIO()
    reporter = Reporter(env={"CI": "true"}, stream=out)
    clock = itertools.count(0.0, 6.0)
    monkeypatch.setattr("unibake.console.time.monotonic", lambda: next(clock))
    with reporter.progress("normalise", 1 << 30) as advance:
        advance(0)
        advance(1 << 29)
        advance(3 << 29)
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("    normalise: 0.50 GiB of 1.00 GiB, ") and lines[1].endswith(" s left")
    assert lines[2].startswith("    normalise: 2.00 GiB (more than the 1.00 GiB expected), ") and "left" not in lines[2]

    from rich.progress import Progress

    made = []

    class Recorded(Progress):  # rich's own bar, kept to read its task's total
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr("unibake.console.Progress", Recorded)
    totals = []
    with Reporter(env={}, stream=Terminal()).progress("normalise", 100) as advance:
        for _ in range(2):
            advance(60)
            totals.append([(t.description, t.completed, t.total) for t in made[0].tasks])
    assert totals == [[("normalise", 60, 100)], [("normalise (more than expected)", 120, 120)]], totals


@pytest.mark.parametrize("script", ["scripts/verify-release.sh", "unibake/templates/kit-verify.sh.j2",
                                    "unibake/templates/apply.sh.j2"])
def test_each_shell_verifier_hides_exactly_the_characters_one_line_escapes_and_the_c1_controls(script):
    # the shell verifiers (and apply.sh) stand alone, so each writes its own sed program (`hidden`) of what
    # one_line escapes: a character added to one list and not to the others would show reordered text in one verifier only
    from unibake.console import _HIDDEN

    text = (Path(__file__).resolve().parents[2] / script).read_text()
    line = re.search(r"^hidden=\$\(printf '[^'\n]*'\)$", text, re.M)
    assert line, f"{script}: no hidden=$(printf '...') line"
    points = [c for c in [*range(0x80, 0x3000), *range(0xFE00, 0x10000), *range(0xE0000, 0xE0100)]
              if not 0xD800 <= c <= 0xDFFF]
    lines = "".join(f"a{chr(c)}b\n" for c in points).encode()
    shown = subprocess.run(["sh", "-c", line.group() + '\nLC_ALL=C sed "$hidden"'], input=lines,
                           capture_output=True, check=True, timeout=60).stdout.decode().splitlines()
    assert len(shown) == len(points)
    hidden = {c for c, out in zip(points, shown) if out == "a?b"}
    assert {c for c, out in zip(points, shown) if out not in ("a?b", f"a{chr(c)}b")} == set()
    expected = {c for c in points if 0x80 <= c <= 0x9F or _HIDDEN.match(chr(c))}
    assert sorted(map(hex, hidden ^ expected)) == []
