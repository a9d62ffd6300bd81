"""``build.py deploy``: one release onto many engines at once, each checked, none stopping the others.

Every engine gets its own thread (at most ``--jobs`` at a time): an engine that already holds the
image is skipped (its tag set when missing), otherwise the release's archive is loaded into it
(decompressed here and streamed, hashed as it goes, a load that brought another image undone, as
``verify --load`` does) or it pulls the pushed digest from the registry; then its image ID is
compared with the release's. A failing engine (unreachable, a refused load, another image ID) is
one row of the table; the others go on; any failure is exit 3.
"""

from __future__ import annotations

import os
import queue
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .engine import Engine
from .errors import HandoffAborted, InputError, UnibakeError, VerificationError
from .files import read_small_text
from .manifest import ReleaseManifest
from .platforms import DEFAULT as DEFAULT_PLATFORM
from .verify import checked_load

ADDRESS_RE = re.compile(r"^(unix|tcp|ssh|http|https)://[^\s]{1,400}$")
HOSTS_LIMIT = 1 << 20
SOURCES = ("archive", "registry")


@dataclass(frozen=True, kw_only=True)
class NodeResult:
    engine: str
    result: str  # loaded | pulled | skipped | tagged | failed | stopped (an interrupt ended its load)
    seconds: float
    detail: str = ""
    image_id: str = ""

    @property
    def failed(self) -> bool:
        return self.result == "failed"


def check_address(address: str, where: str) -> str:
    """An engine address as docker-py takes it: unix://, tcp://, ssh://user@host, http(s)://."""
    from .docker_engine import parse_address

    well_formed = ADDRESS_RE.fullmatch(address) and all(c.isprintable() for c in address)
    problem = parse_address(address) if well_formed else None
    if well_formed and not problem:
        try:
            same_engine(address)
        except ValueError as exc:  # (ssh://h:0, unix://@: a traceback in deploy before)
            problem = str(exc)[:200]
    if not well_formed or problem:
        raise InputError(f"{where}: {address[:100]!r} is not an engine address (unix:///path, tcp://host:port or "
                         f"ssh://user@host){': ' + problem if problem else ''}")
    return address


def read_hosts(path: Path) -> list[str]:
    """``--hosts FILE``: one engine address per line; blank lines and ``#`` comments are skipped."""
    try:
        piped = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        piped = False  # (said by the read below)
    if piped:  # read_small_text says "not a regular file", which names no way out
        raise InputError(f"{path}: a pipe (like <(...) or /dev/stdin), not a file: save the list of engines to a "
                         "file and give that (--hosts FILE)")
    text = read_small_text(path, InputError, limit=HOSTS_LIMIT, what="a list of engine addresses, one a line")
    found: list[str] = []
    lines: dict[str, tuple[int, str]] = {}  # an engine (as same_engine tells them apart): its first line
    # lines ended by "\n" alone (a "\r" before it dropped by strip): str.splitlines() also ends one at a form
    # feed, \x1c-\x1e, \x85 or U+2028, which put two engines on one line and every later line's number off
    for n, line in enumerate(text.removesuffix("\n").split("\n"), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            found.append(check_address(line, f"{path}:{n}"))
            first = lines.setdefault(same_engine(line), (n, line))
            if first[0] != n:  # a node pasted twice: said where, not as an engine named twice somewhere
                same = "" if first[1] == line else f" as {first[1]}"
                raise InputError(f"{path}:{n}: engine {line} is named twice (line {first[0]}{same}); name each "
                                 "engine once")
    if not found:
        raise InputError(f"{path}: no engine address in it")
    return found


def same_engine(address: str) -> str:
    """What tells one engine from another in a checked address: docker-py's reading of it (a
    trailing slash and ssh's default port 22 dropped) with the host's case folded, as DNS folds it."""
    from urllib.parse import urlsplit

    import docker

    parsed = docker.utils.parse_host(address, False, False)
    if parsed.startswith("http+unix:"):
        # the socket docker-py connects to (its UnixHTTPAdapter: what follows "http+unix://", a '/' put before it):
        # unix://tmp/x.sock is /tmp/x.sock, not the engine "tmp"; its case kept, '//' and links (/var/run) resolved
        path = parsed.removeprefix("http+unix:").removeprefix("//")
        if not path:
            raise ValueError("it names no socket")
        return "unix://" + os.path.realpath(path if path.startswith("/") else "/" + path)
    parts = urlsplit(parsed)
    try:
        port = parts.port  # a number: 02375 is 2375
    except ValueError:  # (what docker-py made of ssh://h:0: "h:0:22")
        port = 0
    if not parts.hostname or port == 0:
        raise ValueError("it names no host, or a port no connection can use")
    if parts.scheme == "ssh" and port == 22:
        port = None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # (hostname is lower-case)
    user = f"{parts.username}@" if parts.username else ""
    return f"{parts.scheme}://{user}{host}{f':{port}' if port else ''}"


def engines_of(addresses: list[str], hosts: list[str], hosts_file: Path | None = None) -> list[str]:
    """The engines of the command line and the hosts file (``hosts_file``, named in an error), each once,
    in order."""
    out: list[str] = []
    seen: dict[str, str] = {}
    for n, address in enumerate([*addresses, *hosts]):
        check_address(address, "--engine")
        key = same_engine(address)
        if key in seen:
            same = "" if seen[key] == address else f" (as {seen[key]})"
            if hosts_file is not None and n >= len(addresses) and seen[key] in addresses:
                raise InputError(f"--hosts {hosts_file}: engine {address} is given as --engine {seen[key]} too; "
                                 "name each engine once")
            raise InputError(f"engine {address} is named twice{same}")
        seen[key] = address
        out.append(address)
    if not out:
        raise InputError("deploy needs at least one engine: --engine URL (repeat it), --hosts FILE or DOCKER_HOST")
    return out


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What goes onto every engine: the release, and how (its archive, or a pull of its pushed digest)."""

    folder: Path
    manifest: ReleaseManifest
    source: str  # archive | registry
    # the registry's pull into one engine (an event set breaks it off, the callable told its bytes); returns the
    # image ID
    pull: Callable[[Engine, threading.Event, Callable[[int], None]], str] | None = None
    # one engine's byte counter (what, total): told the archive's bytes as the engine is sent them, or the
    # bytes the engine pulls; several run at once (one per engine), so no terminal bar
    counter: Callable[[str, int | None], Callable[[int], None]] = lambda what, total: lambda n: None
    pull_bytes: int | None = None  # the layers' bytes a pull downloads (what the registry's manifest says)


def _until(stop: threading.Event, chunks: Iterable[bytes],
           advance: Callable[[int], None] = lambda n: None) -> Iterator[bytes]:
    """``chunks`` until ``stop`` is set: then the stream breaks off, and the engine refuses the load
    (``advance`` told each chunk's bytes as the engine takes it)."""
    for chunk in chunks:
        if stop.is_set():
            raise HandoffAborted("interrupted")
        yield chunk
        advance(len(chunk))


def _foreign(engine: Engine, m: ReleaseManifest) -> str:
    """A note for a row whose engine is of another platform than the image: it holds the image, and
    runs it only under emulation (if at all), which a loaded row alone would not tell."""
    try:
        theirs = engine.platform()
    except UnibakeError:
        return ""
    ours = m.platform or DEFAULT_PLATFORM
    if not theirs or theirs == ours:
        return ""
    return f"; the engine is {theirs}, the image {ours}: it runs there only under emulation"


def _deploy_one(plan: Plan, address: str, connect: Callable[[str], Engine],
                stop: threading.Event | None = None) -> NodeResult:
    m = plan.manifest
    stop = stop or threading.Event()
    start = time.monotonic()

    def done(result: str, detail: str = "", image_id: str = "") -> NodeResult:
        return NodeResult(engine=address, result=result, seconds=round(time.monotonic() - start, 2),
                          detail=detail, image_id=image_id)

    try:
        engine = connect(address)
        held = engine.inspect_image(m.image_id)
        tagged = engine.inspect_image(m.tag)
        # the release's tag on another image (a build of the same version, an older release made again):
        # moved to the release's image, and said, as that image is left without the name
        moved = f"; {m.tag} named {tagged.id[:19]}... before" if tagged is not None and tagged.id != m.image_id else ""
        if held is not None:
            if not moved and tagged is not None:
                return done("skipped", f"already holds the image{_foreign(engine, m)}", m.image_id)
            engine.tag(m.image_id, m.tag)
            return done("tagged", f"already held the image; tagged {m.tag}{moved}{_foreign(engine, m)}",
                        m.image_id)
        if m.hotfix and plan.source == "archive" and engine.inspect_image(m.hotfix.base_image_id) is None:
            # its archive leaves out the base release's layers; a pull of its push brings every layer
            return done("failed", f"this hotfix needs release {m.hotfix.base_release} ({m.hotfix.base_image_id[:19]}) "
                                  "first; nothing was loaded")
        if plan.source == "registry":
            try:
                plan.pull(engine, stop, plan.counter(f"{address}: pull", plan.pull_bytes))
            except (HandoffAborted, UnibakeError):
                if stop.is_set():  # broken off: the engine ends the pull, and nothing was tagged
                    return done("stopped", "the interrupt broke its pull off: the release was not tagged")
                raise
            result = "pulled"
        else:
            sent = []  # (once the engine has the whole archive, an interrupt finds it storing the image)

            def feed(chunks: Iterable[bytes]) -> Iterator[bytes]:
                yield from _until(stop, chunks, advance)
                sent.append(True)

            try:  # as verify --load: the stream hashed, its end held back till it matches; another image undone
                advance = plan.counter(f"{address}: load", m.archive.uncompressed_bytes)
                problem = checked_load(engine, plan.folder, m, feed, stop=stop)
            except Exception:
                if stop.is_set() and sent:  # the engine's answer broken off: it may still add the image
                    return done("stopped", f"the interrupt broke its load off once the engine had the whole archive: "
                                           f"it may still add the image (unchecked; docker image inspect {m.tag})")
                if stop.is_set():  # however the engine's client put the broken-off stream
                    return done("stopped", "the interrupt broke its load off: the engine did not take the image")
                raise
            if problem:
                return done("failed", problem)
            result = "loaded"
        got = engine.inspect_image(m.tag)
        if got is None or got.id != m.image_id:
            return done("failed", f"image ID {got.id if got else '(no image)'} after the {result[:-2]}, not "
                                  f"{m.image_id}", got.id if got else "")
        return done(result, f"image ID {m.image_id[:19]}... checked{moved}{_foreign(engine, m)}", m.image_id)
    except UnibakeError as exc:
        return done("failed", str(exc))
    except Exception as exc:  # one node's surprise must not stop the others: it is that node's row
        return done("failed", f"{type(exc).__name__}: {str(exc)[:200]}")


def deploy(plan: Plan, addresses: list[str], connect: Callable[[str], Engine], *, jobs: int = 4,
           on_result: Callable[[NodeResult], None] = lambda r: None) -> list[NodeResult]:
    """Every engine in parallel (``jobs`` at a time); results in the order the engines were given,
    ``on_result`` called with each as its engine ends.

    On an interrupt the loads under way break off at their next piece, the pulls under way at once
    (their connection shut: the engine ends the pull), the engines not begun are not begun, and the
    interrupt says which engines hold the release and what became of the others. The
    workers are daemon threads: one stuck on an engine that does not answer is let go by a third
    interrupt (and by the exit), not waited for as a pool's threads are."""
    stop = threading.Event()
    results: list[NodeResult | None] = [None] * len(addresses)
    # each engine's row as it ends, not in the order given: one slow engine (a big load, a node that stops
    # answering until --engine-timeout) must not hold back the word of every engine after it
    finished: queue.SimpleQueue[int] = queue.SimpleQueue()
    todo = iter(range(len(addresses)))
    lock = threading.Lock()

    begun: set[int] = set()

    def work() -> None:
        while not stop.is_set():
            with lock:
                i = next(todo, None)
                if i is not None:
                    begun.add(i)
            if i is None:
                return
            results[i] = _deploy_one(plan, addresses[i], connect, stop)
            finished.put(i)

    workers = [threading.Thread(target=work, name=f"deploy-{n}", daemon=True)
               for n in range(max(1, min(jobs, len(addresses))))]
    for worker in workers:
        worker.start()
    try:
        for _ in range(len(addresses)):
            on_result(results[finished.get()])
    except KeyboardInterrupt:
        stop.set()
        try:
            for worker in workers:  # a second interrupt is let be while this waits; a third ends it
                worker.join()
        except KeyboardInterrupt:  # (said all the same: the engines let go are still under way)
            raise KeyboardInterrupt(interrupted_note(addresses, results, begun)) from None
        raise KeyboardInterrupt(interrupted_note(addresses, results, begun)) from None
    return results


def interrupted_note(addresses: list[str], results: list[NodeResult | None], begun: set[int] | None = None) -> str:
    """Which engines hold the release after an interrupt (loaded or already holding it, checked), and
    which do not, and why: a load or a pull broken off, a failure, not begun, or (``begun``, its row not in:
    let go by a third interrupt) still under way."""
    got = [r.engine for r in results if r is not None and not r.failed and r.result != "stopped"]
    why = {}
    for n, (address, r) in enumerate(zip(addresses, results)):
        if r is None:
            why[address] = "still under way, let go" if begun and n in begun else "not begun"
        elif r.result == "stopped":
            why[address] = f"its {'pull' if 'pull' in r.detail else 'load'} was broken off" + (
                " once the engine had the whole archive: it may still add the image" if "may still add" in r.detail
                else "")
        elif r.failed:
            why[address] = "failed"
    missing = [a for a in addresses if a not in got]
    reasons = "; ".join(f"{a}: {why[a]}" if len(missing) > 1 else why[a] for a in missing if a in why)
    reasons = f" ({reasons})" if reasons else ""
    if not got:
        return f"no engine got the release{reasons}"
    said = f"{', '.join(got)} {'holds' if len(got) == 1 else 'hold'} the release (checked)"
    return f"{said}; {', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not{reasons}" if missing else said


def raise_if_failed(results: list[NodeResult]) -> None:
    failed = [r for r in results if r.failed]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise VerificationError(f"{len(failed)} of {len(results)} engines failed: {first.engine}: {first.detail}{more}")
