"""One reporter for the whole run: stage timings, build output, progress and the closing summary.

On a terminal it uses rich (a live status line, a progress bar, tables); when stderr is not a
terminal, or ``CI`` is set, it prints plain lines so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)
from rich.table import Table


@dataclass(kw_only=True)
class StageTime:
    name: str
    seconds: float
    status: str  # ok | failed | skipped
    detail: str = ""


class Reporter:
    def __init__(self, *, env: Mapping[str, str], stream=None, quiet: bool = False):
        stream = stream or sys.stderr
        self.plain = not stream.isatty() or bool(env.get("CI"))
        self.console = Console(file=stream, highlight=False, soft_wrap=True,
                               force_terminal=False if self.plain else None, no_color=self.plain)
        self.quiet = quiet
        self.stages: list[StageTime] = []
        self._status = None

    def info(self, message: str) -> None:
        if not self.quiet:
            self.console.print(message, markup=False)

    def warn(self, message: str) -> None:
        self.console.print(f"warning: {message}", markup=False)

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
            state = {"done": 0, "last": time.monotonic(), "start": time.monotonic()}

            def advance(n: int) -> None:
                state["done"] += n
                now = time.monotonic()
                if now - state["last"] >= 5:
                    state["last"] = now
                    rate = state["done"] / max(now - state["start"], 1e-6)
                    eta = f", about {max(total - state['done'], 0) / rate:.0f} s left" if total and rate else ""
                    share = f" of {total / 2**30:.2f} GiB" if total else ""
                    self.console.print(f"    {description}: {state['done'] / 2**30:.2f} GiB{share}, "
                                       f"{rate / 2**20:.0f} MiB/s{eta}", markup=False)

            yield advance
            return
        with Progress(TextColumn("    {task.description}"), BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), TimeRemainingColumn(), console=self.console,
                      transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)

    def build_line(self, line: str) -> None:
        """One line of build output: every line in plain mode; step headers and a status otherwise."""
        if self.quiet:
            return
        if self.plain:
            self.console.print(f"    {line}", markup=False)
            return
        if line.startswith("Step "):
            self.console.print(f"    {line}", markup=False, style="bold")
            self._stop_status()
            self._status = self.console.status(line[:100])
            self._status.start()
        elif self._status is not None:
            self._status.update(line[:100])

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def table(self, title: str, columns: list[str], rows: list[list[str]]) -> None:
        """A plain table of results (verify, releases): aligned text when plain, rich otherwise."""
        if self.plain:
            widths = [max(len(str(x)) for x in [c] + [r[i] for r in rows]) for i, c in enumerate(columns)]
            self.console.print(title, markup=False)
            for row in [columns] + rows:
                self.console.print("  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip(),
                                   markup=False)
            return
        table = Table(title=title, title_justify="left", header_style="bold")
        for c in columns:
            table.add_column(c, overflow="fold")
        for r in rows:
            table.add_row(*[str(x) for x in r])
        self.console.print(table)

    def summary(self, title: str, rows: list[tuple[str, str]]) -> None:
        """The closing table: stages with their times, then the facts (size, SHA256, where)."""
        if self.plain:
            self.console.print(title, markup=False)
            for st in self.stages:
                detail = f" ({st.detail})" if st.detail else ""
                self.console.print(f"  {st.name:<12} {st.seconds:8.1f} s  {st.status}{detail}", markup=False)
            for key, value in rows:
                self.console.print(f"  {key + ':':<13} {value}", markup=False)
            return
        table = Table(title=title, show_header=True, header_style="bold", title_justify="left")
        table.add_column("stage")
        table.add_column("time", justify="right")
        table.add_column("result")
        for st in self.stages:
            table.add_row(st.name, f"{st.seconds:.1f} s", st.status + (f" ({st.detail})" if st.detail else ""))
        self.console.print(table)
        facts = Table(show_header=False, box=None)
        facts.add_column(style="bold", no_wrap=True)
        facts.add_column(overflow="fold")
        for key, value in rows:
            facts.add_row(key, value)
        self.console.print(facts)
