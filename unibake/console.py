"""The terminal side of a run: stage lines, build output, progress bars, tables and the summary.

Everything goes to stderr (stdout is kept for ``--json``). On a terminal it uses rich (a live
status line, progress bars, tables); when stderr is not a terminal, or ``CI`` is set, it prints
plain lines so logs stay readable, with a progress line every few seconds instead of a bar.
``NO_COLOR`` turns colour off; ``--quiet`` leaves errors, warnings and the final line.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)
from rich.table import Table
from rich.text import Text

from .files import visible_name


STEP_RE = re.compile(r"^Step ([0-9]+)/([0-9]+) : ")


@dataclass(kw_only=True)
class StageTime:
    name: str
    seconds: float
    status: str  # ok | failed | skipped
    detail: str = ""


WIDTH = 80  # the summary stays readable in a terminal this wide


# control characters, C1 ones too, as visible escapes: text that comes from outside (an image's output, a
# file name in a layer) can neither end the line it is on (a second, forged "error:" line) nor drive
# the terminal (clear it, retitle it)
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


# Characters a terminal shows as nothing, or as another order of the text around them: the bidi embeddings,
# overrides, isolates and marks ("Trojan Source", CVE-2021-42574: a file name "run\u202ehs.txt" reads
# "runtxt.sh"), the line and paragraph separators, the zero-width space and word joiners, the byte-order
# mark, the interlinear annotations and the tag characters (invisible "ASCII" an LLM reads). Each is shown as
# its escape, as repr shows it. The joiners U+200C and U+200D stay: scripts and emoji need them.
_HIDDEN = re.compile("[\u00ad\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
                     "\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]")


_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1 controls


def replaced(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1) and every character :data:`_HIDDEN` names as U+FFFD:
    for text that is written where a reader sees it (the notes, the manifest's fields), not escaped as a line."""
    return _HIDDEN.sub("\ufffd", _UNSHOWN.sub("\ufffd", text))


def _escaped(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\u{c:04x}" if c <= 0xFFFF else f"\\U{c:08x}"


def one_line(text: str) -> str:
    """``text`` as one printable line (a name that is not UTF-8 written visibly: ``caf\\xe9``, never a
    lone surrogate, which a terminal's strict encoding refuses), with no character that hides or reorders
    what is around it (``\\u202e``)."""
    text = visible_name(text).translate(_CONTROLS)
    return text if text.isascii() else _HIDDEN.sub(_escaped, text)


class Reporter:
    def __init__(self, *, env: Mapping[str, str], stream=None, quiet: bool = False):
        stream = stream or sys.stderr
        self.plain = not stream.isatty() or bool(env.get("CI"))
        no_color = self.plain or bool(env.get("NO_COLOR"))
        self.console = Console(file=stream, highlight=False, soft_wrap=True,
                               force_terminal=False if self.plain else None, no_color=no_color,
                               color_system=None if no_color else "auto")
        self.quiet = quiet
        self.stages: list[StageTime] = []
        self._status = None
        self._steps = None  # the build's progress bar: (Progress, task)

    def info(self, message: str) -> None:
        if not self.quiet:
            self.console.print(one_line(message), markup=False)

    def warn(self, message: str) -> None:
        self.console.print(f"warning: {one_line(message)}", markup=False)

    def final(self, line: str) -> None:
        """The one line a command ends with; printed even with --quiet."""
        self.console.print(one_line(line), markup=False)

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[StageTime]:
        record = StageTime(name=name, seconds=0.0, status="ok", detail=detail)
        self.info(f"==> {name}{': ' + detail if detail else ''}")
        start = time.monotonic()
        try:
            yield record
        except BaseException:
            record.status = "failed"
            raise
        finally:
            record.seconds = time.monotonic() - start
            self.stages.append(record)
            self._stop_status()
            if record.status == "ok":
                self.info(f"    {name} done in {record.seconds:.1f} s")

    def skipped(self, name: str, why: str) -> None:
        self.stages.append(StageTime(name=name, seconds=0.0, status="skipped", detail=why))
        self.info(f"==> {name}: skipped ({why})")

    @contextmanager
    def progress(self, description: str, total: int | None) -> Iterator:
        """A byte counter for long work: a rich bar on a terminal, a line every few seconds otherwise."""
        if self.quiet:
            yield lambda n: None
            return
        if self.plain:
            yield self.counter(description, total)
            return
        with Progress(TextColumn("    {task.description}", markup=False), BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), TimeRemainingColumn(), console=self.console,
                      transient=True) as bar:
            task = bar.add_task(description, total=total)
            done = [0]

            def advance(n: int) -> None:
                done[0] += n
                if total and done[0] > total:  # past what was expected (a total that was an estimate): the bar is
                    # full, and says so, not 120 %
                    bar.update(task, total=done[0], description=f"{description} (more than expected)")
                bar.advance(task, n)

            yield advance

    def counter(self, description: str, total: int | None) -> Callable[[int], None]:
        """A byte counter that prints a line every few seconds, on a terminal too: for work done in several
        threads at once (one engine's load each), whose lines say each one's name, as bars would not."""
        if self.quiet:
            return lambda n: None
        start = time.monotonic()
        state = {"done": 0, "last": start, "first": None, "head": 0}
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                now = time.monotonic()
                if state["first"] is None:
                    # the rate is counted from the first bytes on: the wait for them (an engine's export writes its
                    # whole temporary folder before its first byte) made a rate of 0 MiB/s and "about 35846 s left"
                    state["first"], state["head"] = now, n
                state["done"] += n
                if now - state["last"] < 5:
                    return
                state["last"] = now
                done, first, head = state["done"], state["first"], state["head"]
            span = now - first
            rate = (done - head) / span if span >= 1 else 0.0
            # a total is what the work was expected to be (an image's size, for a save stream a little longer):
            # past it, the line says so, not "6.10 GiB of 6.00 GiB, about 0 s left"
            within = bool(total) and done <= total
            eta = f", about {max(total - done, 0) / rate:.0f} s left" if within and rate else ""
            share = f" of {total / 2**30:.2f} GiB" if within else \
                f" (more than the {total / 2**30:.2f} GiB expected)" if total else ""
            speed = f", {rate / 2**20:.0f} MiB/s" if rate else f", the first bytes after {first - start:.0f} s"
            self.console.print(f"    {description}: {done / 2**30:.2f} GiB{share}{speed}{eta}", markup=False)

        return advance

    def build_line(self, line: str) -> None:
        """One line of build output: every line in plain mode; a bar over the steps otherwise."""
        if self.quiet:
            return
        line = one_line(line)
        if self.plain:
            self.console.print(f"    {line}", markup=False)
            return
        step = STEP_RE.match(line)
        if step:
            self.console.print(f"    {line[:WIDTH * 2]}", markup=False, style="bold")
            done, total = int(step.group(1)) - 1, int(step.group(2))
            if self._steps is None:
                # (the build's own text shown as it is: rich markup in it, "[/opt/lib]", is neither obeyed nor an error)
                bar = Progress(TextColumn("    build"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[now]}", markup=False), console=self.console, transient=True)
                self._steps = (bar, bar.add_task("build", total=total, now=""))
                bar.start()
            bar, task = self._steps
            bar.update(task, completed=done, total=total, now=line[:40])
        elif self._steps is not None:
            bar, task = self._steps
            bar.update(task, now=line.strip()[:40])

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if self._steps is not None:
            self._steps[0].stop()
            self._steps = None

    def table(self, title: str, columns: list[str], rows: list[list[str]]) -> None:
        """A plain table of results (verify, releases): aligned text when plain, rich otherwise."""
        if self.quiet:
            return
        # cells carry text from outside (a folder's name, a manifest's problem): one printable line
        # each, so none can forge an error: line or drive the terminal, and never rich markup
        title, columns = one_line(str(title)), [one_line(str(c)) for c in columns]
        rows = [[one_line(str(x)) for x in r] for r in rows]
        if self.plain:
            widths = [max(len(str(x)) for x in [c] + [r[i] for r in rows]) for i, c in enumerate(columns)]
            self.console.print(title, markup=False)
            for row in [columns] + rows:
                self.console.print("  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip(),
                                   markup=False)
            return
        table = Table(title=Text(title), title_justify="left", header_style="bold")
        for c in columns:
            table.add_column(Text(c), overflow="fold")
        for r in rows:
            table.add_row(*[Text(x) for x in r])
        self.console.print(table)

    def summary(self, title: str, rows: list[tuple[str, str]], final: str) -> None:
        """The closing summary: stages with their times, then the facts (size, SHA256, where), then
        one final line; ``--quiet`` keeps only the final line. Fits 80 columns: a value too long for
        its line goes on the next one, whole (digests are copied from here)."""
        # every word of it through one_line, as every other line: a stage's detail and a row's value hold what the
        # image or its metadata says (a smoke.skip reason: a bidi override or a CSI reached the terminal as it was)
        if not self.quiet:
            self.console.print(one_line(title), markup=False)
            for st in self.stages:
                detail = f" ({one_line(st.detail)})" if st.detail else ""
                line = f"  {one_line(st.name):<16} {st.seconds:7.1f} s  {st.status}{detail}"
                self.console.print(line if len(line) <= WIDTH else line[:WIDTH - 1] + "…", markup=False)
            for key, value in rows:
                key, value = one_line(key), one_line(value)
                line = f"  {key + ':':<17} {value}"
                if len(line) <= WIDTH:
                    self.console.print(line, markup=False)
                else:
                    self.console.print(f"  {key}:", markup=False)
                    self.console.print(f"    {value}", markup=False)
        self.console.print(one_line(final), markup=False)
