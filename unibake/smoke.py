"""The smoke gate of every profile, on the image as loaded in the verify engine.

For each profile: ``self-check`` passes; the engine starts with that ``PROFILE`` (with a restart
policy, so that a crash the engine recovers from is counted, not hidden); ``/health`` answers;
every prompt gets the reply the profile expects: the exact reply unless the profile asks for
``contains`` or a regular expression (which must match the whole trimmed reply); the reply and an
exact or contained expected text are compared with their surrounding spaces, tabs and line ends trimmed; then the container must still be running, never restarted and never OOM-killed.
The HTTP client runs in the verify engine's network namespace (the scratch engine's bridge is
invisible from here otherwise); in an engine not ours (``--verify-engine``: :data:`OWN_NAMESPACE`), in
the gate container's own namespace where its process is on this host, so that the address it asks is
that container's and no other's; where it is not, the container's address is asked from here, and once
the container is removed nothing may answer there any more (else the replies were another server's).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

from .console import one_line
from .engine import ContainerStatus, Engine
from .errors import EngineError, NameInUse, RunTimedOut
from .manifest import ChatCheck, GateResult, GateStep
from .metadata import ImageMetadata, ProfileMetadata, SmokePrompt
from .publish import held_signals
from .schema import shm_bytes
from .smoke_client import MAX_TOKENS, MIN_WAIT

PACKAGE_PARENT = Path(__file__).resolve().parent.parent  # what makes ``unibake`` importable
# run_gates' netns_pid for an engine not ours (--verify-engine): each gate container's own network namespace
OWN_NAMESPACE = -1
GONE_WAIT = 2  # seconds the client asks a removed container's address for /health: nothing may answer
WHITESPACE = " \t\r\n"  # what a reply and an expected text are trimmed of (str.strip() also takes \x1c-\x1f,
# U+0085, U+00A0, U+3000: an exact reply with a control character or a no-break space at its end passed)
RESTARTS = 2  # the restart policy of a gate's container: enough to count a crash, not to loop on one
TAIL_CHARS = 300  # of each line of the image's output an error line quotes (its end: where the error is)


def _warn(message: str) -> None:
    print(f"warning: {one_line(message)}", file=sys.stderr)


REGEX_SECONDS = 10.0  # a regex against a reply of at most 1 MiB: far longer than any match that ends takes
# the match, in a child process that can be stopped: ``re`` cannot be interrupted, and patterns the
# plan accepts (.* a .* b .*) still backtrack polynomially, minutes on a long wrong reply
_MATCH = "import json, re, sys; p, t = json.load(sys.stdin); print(re.fullmatch(p, t) is not None)"


def _regex_mismatch(pattern: str, text: str) -> str | None:
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _MATCH], input=json.dumps([pattern, text]),
                              capture_output=True, text=True, timeout=REGEX_SECONDS)
    except subprocess.TimeoutExpired:
        return (f"the regular expression {pattern[:80]!r} took longer than {REGEX_SECONDS:g} s on a reply of "
                f"{len(text.encode())} bytes (write it with fewer unbounded repeats like .*)")
    if done.returncode != 0 or done.stdout.strip() not in ("True", "False"):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the regular expression {pattern[:80]!r} could not be matched: {tail[:200]}"
    return None if done.stdout.strip() == "True" else f"expected a reply matching {pattern!r}"


def mismatch(reply: str, check: SmokePrompt) -> str | None:
    """Why ``reply`` is not what ``check`` expects; None when it is (no expectation: any non-empty reply)."""
    text = reply.strip(WHITESPACE)
    # as a blank expectation is refused: an engine that answers nothing fails (an image's own metadata may
    # hold a blank one, which "contains" found in every reply, an empty one too)
    if check.expect is None or (check.match != "regex" and not check.expect.strip(WHITESPACE)):
        return None if text else "expected a non-empty reply"
    if check.match == "exact":
        expected = check.expect.strip(WHITESPACE)
        if text == expected:
            return None
        if unicodedata.normalize("NFC", text) == unicodedata.normalize("NFC", expected):
            # the two would print alike: say how they differ (compared as they are, code point by code point)
            return (f"expected exactly {check.expect!r} (the reply is the same text in another Unicode normal "
                    f"form, {ascii(text)[:300]})")
        return f"expected exactly {check.expect!r}"
    if check.match == "contains":
        # trimmed as exact trims it (a stray space; a newline an image's own metadata holds): the expected text is
        # the words, wherever they stand in the reply
        expected = check.expect.strip(WHITESPACE)
        if expected in text:
            return None
        if unicodedata.normalize("NFC", expected) in unicodedata.normalize("NFC", text):
            return (f"expected {check.expect!r} in the reply (it holds the same text in another Unicode normal form: "
                    f"{ascii(text)[:300]})")
        return f"expected {check.expect!r} in the reply"
    return _regex_mismatch(check.expect, text)


def max_tokens(check: SmokePrompt) -> int:
    """What a prompt asks the engine for at most: room for its whole expected reply (no token is
    shorter than a byte) and MAX_TOKENS more, so that an engine is never cut short of the answer."""
    return MAX_TOKENS + len((check.expect or "").encode("utf-8"))


def _probe_command(url: str, model: str, timeout: int, netns: int | str | None) -> list[str]:
    """The client's command line; its prompts go on its standard input (:func:`_probe_input`). ``netns``: the
    PID whose network namespace it runs in, or a path to one (None: this process's). -P: the working folder is
    not put before the package on its path (a json.py there would have answered for the client)."""
    cmd = [sys.executable, "-P", "-m", "unibake.smoke_client", url, model, str(timeout)]
    if netns is not None:
        cmd = ["nsenter", f"--net={netns if isinstance(netns, str) else f'/proc/{netns}/ns/net'}", "--"] + cmd
    return cmd


def _own_namespace(engine: Engine, container: str) -> int | None:
    """A descriptor of ``container``'s own network namespace, where its process is on this host (the cgroup of
    the PID the engine gives names the container) and this process may enter it (nsenter, tried: root with
    CAP_SYS_ADMIN); None otherwise (an engine on another host, this process in a container beside the
    engine's, a user who may open the namespace but not enter it, no nsenter). Held open, it is that
    namespace however the PID is used after."""
    status = engine.container_status(container)
    if status.pid <= 0 or not re.fullmatch(r"[0-9a-f]{64}", status.id):
        return None
    try:
        fd = os.open(f"/proc/{status.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:  # read after the open: the namespace held is that process's, which the cgroup says is the container's
        if status.id in Path(f"/proc/{status.pid}/cgroup").read_text(errors="replace") and _enters(fd):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _enters(fd: int) -> bool:
    """Whether nsenter can enter the network namespace open as ``fd`` (opening it needs less than entering it:
    a user of the docker group opens a container's that runs as that user, and cannot enter it)."""
    try:
        return subprocess.run(["nsenter", f"--net=/proc/self/fd/{fd}", "--", "true"], pass_fds=(fd,),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):  # (no nsenter)
        return False


def _nobody_else(url: str) -> GateStep:
    """After the gate's containers are removed: nothing answers ``url``/health from here any more. The client
    asked the container's address from this host's network namespace, where another engine's container can
    hold the same address (every engine's default bridge is 172.17.0.0/16): that one's replies would have
    passed for the image's."""
    start = time.monotonic()
    try:
        done = subprocess.run(_probe_command(url, "-", GONE_WAIT, None), input="[]", capture_output=True, text=True,
                              timeout=GONE_WAIT + PROBE_MARGIN, env={**os.environ, "PYTHONPATH": str(PACKAGE_PARENT)})
        answer = _answer(done.stdout, done.stderr, complete=True, prompts=0)
    except (subprocess.TimeoutExpired, EngineError) as exc:
        detail = f"could not make sure nothing else answers at {url} once the gate's container was removed: {exc}"
        return GateStep(name="address", passed=False, seconds=time.monotonic() - start, detail=one_line(detail)[:500])
    seconds = time.monotonic() - start
    if answer.get("health"):
        return GateStep(name="address", passed=False, seconds=seconds, detail=(
            f"{url}/health still answered once the gate's container was removed: the client on this host asked "
            "another server at the container's address (the verify engine is not on this host, or this runs in a "
            "container beside it), so the replies above are not the image's; use the scratch verify engine (no "
            "--verify-engine), or --no-smoke"))
    return GateStep(name="address", passed=True, seconds=seconds,
                    detail=f"asked from this host; nothing answers at {url} once the gate's container is removed")


def _probe_input(checks: tuple[SmokePrompt, ...]) -> str:
    """The prompts, each with its max_tokens, as the client reads them: on its standard input, not its
    command line, where Linux takes at most 128 KiB an argument (an image's own metadata may hold
    prompts of many times that: the start failed with "Argument list too long", exit 1)."""
    return json.dumps([[c.prompt, max_tokens(c)] for c in checks])


def _stability(status: ContainerStatus) -> GateStep:
    """After the prompts: still running, never restarted, never OOM-killed."""
    problems = []
    if status.restart_count:
        problems.append(f"restarted {status.restart_count} time{'s' if status.restart_count > 1 else ''}")
    if status.oom_killed:
        problems.append("OOM-killed")
    if not status.running:
        problems.append(f"not running (exit code {status.exit_code})")
    detail = "; ".join(problems) or "running, 0 restarts, not OOM-killed"
    return GateStep(name="stability", passed=not problems, seconds=0.0, detail=detail)


def container_options(spec: ProfileMetadata) -> dict:
    """What of run.sh's ``docker run`` a gate's container is given too: the profile's IPC mode and ``/dev/shm``
    size (it ran with the engine's private IPC and 64 MiB: a server that outgrows that, or needs the host's,
    passed the gate and failed on the GPU machine, or the other way round). Not its GPUs and devices, which the
    verify engine's host need not have (the gate's line says so)."""
    size = spec.topology.shm_size
    return {"ipc": spec.topology.ipc, "shm_size": shm_bytes(size) if size else None}


def run_gate(engine: Engine, image: str, profile: str, spec: ProfileMetadata, *, port: int, model: str,
             netns_pid: int | None, warn=_warn) -> GateResult:
    """One profile's gate; stops at the first step that fails."""
    steps: list[GateStep] = []
    chats: list[ChatCheck] = []
    smoke = spec.smoke
    checks = smoke.checks
    timeout = smoke.timeout

    start = time.monotonic()
    bound = max(120, timeout)
    try:
        check = engine.run(image, ["self-check"], env={"PROFILE": profile}, timeout=bound)
        exit_code, output = check.exit_code, check.output
    except RunTimedOut as exc:  # a check of the image that never ends fails the gate, as one that fails does
        exit_code, output = None, exc.output
    # what failed: the checks go on after one fails, so its "error:" lines, not the last "ok:" ones
    lines = output.strip().splitlines()
    tail = " ".join(_short(line) for line in [line for line in lines if line.startswith("error:")][:2] or lines[-2:])
    failure = f"did not finish within {bound} s: {tail or 'no output'}" if exit_code is None \
        else f"exit {exit_code}: {tail}"
    steps.append(GateStep(name="self-check", passed=exit_code == 0, seconds=time.monotonic() - start,
                          detail="" if exit_code == 0 else failure))
    if exit_code != 0:
        return GateResult(profile=profile, steps=tuple(steps))

    start = time.monotonic()
    if spec.topology.nodes > 1:
        return _multi_node(engine, image, profile, spec, steps, chats, start=start, port=port, model=model,
                           netns_pid=netns_pid, warn=warn)
    # by a name of its own, as a multi-node gate's ranks: one the engine created as an interrupt came (its
    # ID never answered) is removed too, by that name; not when the engine refused the name (another's)
    name = f"unibake-smoke-{secrets.token_hex(6)}"
    try:
        container = engine.start(image, [], env={"PROFILE": profile}, restarts=RESTARTS, name=name,
                                 **container_options(spec))
    except NameInUse:
        raise
    except BaseException:
        _clean_up_after_failure(profile, lambda: engine.remove_container(name), warn)
        raise
    asked_here: list[str] = []
    try:
        stability = _serve(engine, container, checks, steps, chats, start=start, port=port, model=model,
                           timeout=timeout, netns_pid=netns_pid, asked_here=asked_here)
        status = engine.container_status(container)  # recorded for every gate that started, passed or not
    except BaseException:
        _clean_up_after_failure(profile, lambda: engine.remove_container(container), warn)
        raise
    removed = _clean_up_after_failure(profile, lambda: engine.remove_container(container), warn, ended="ended")
    if stability:
        steps.append(_stability(status))
    _confirm_address(steps, asked_here, removed)
    return GateResult(profile=profile, steps=tuple(steps), chats=tuple(chats), restart_count=status.restart_count,
                      oom_killed=status.oom_killed)


def _confirm_address(steps: list[GateStep], asked_here: list[str], removed: bool) -> None:
    """A gate that passed with its client asking from this host (:func:`_serve`'s ``asked_here``): its
    container's address answers no more now that the container is removed (:func:`_nobody_else`). One the
    engine would not remove (warned) may still answer there: nothing can be confirmed, the gate fails."""
    if asked_here and steps and all(step.passed for step in steps):
        steps.append(_nobody_else(asked_here[0]) if removed else GateStep(
            name="address", passed=False, seconds=0.0,
            detail=f"the client asked {asked_here[0]} from this host, and the gate's container could not be removed "
                   "(said above), so whether its replies were its own cannot be confirmed; remove it and run again"))


def rank_env(profile: str, topology, rank: int, master: str) -> dict[str, str]:
    """What run.sh gives the container of one rank (NODE_RANK, MASTER_ADDR: the rank-0 node's address)."""
    return {"PROFILE": profile, "NNODES": str(topology.nodes), "NODE_RANK": str(rank), "MASTER_ADDR": master,
            "MASTER_PORT": str(topology.master_port)}


def _multi_node(engine: Engine, image: str, profile: str, spec: ProfileMetadata, steps: list[GateStep],
                chats: list[ChatCheck], *, start: float, port: int, model: str, netns_pid: int | None,
                warn) -> GateResult:
    """A profile on several nodes: every rank its own container on a private network of the verify
    engine, as run.sh starts one per node (rank 0 reachable by its name, MASTER_ADDR); rank 0's
    replies are gated, and every rank must still be running after them. The containers and the
    network are removed however the gate ends."""
    topology = spec.topology
    network = f"unibake-smoke-{secrets.token_hex(6)}"
    names = [f"{network}-rank{rank}" for rank in range(topology.nodes)]
    started: list[str] = []  # names, not IDs: one started as an interrupt came is removed too
    statuses: list[ContainerStatus] = []
    asked_here: list[str] = []
    stability = False
    made = True  # the network: removed by name however the gate ends, unless that name was another's
    try:
        try:
            engine.create_network(network)  # (in the try: one made as an interrupt came is removed too, by name)
        except NameInUse:
            made = False
            raise
        master = _start_rank(engine, started, image, env=rank_env(profile, topology, 0, names[0]), network=network,
                             name=names[0], **container_options(spec))
        running, address, _ = engine.container_state(master)
        for _ in range(50):  # its address, for the peers' /etc/hosts (a network's own names need its DNS)
            if address or not running:
                break
            time.sleep(0.1)
            running, address, _ = engine.container_state(master)
        if running and address:
            for rank in range(1, topology.nodes):
                _start_rank(engine, started, image, env=rank_env(profile, topology, rank, names[0]), network=network,
                            name=names[rank], hosts={names[0]: address}, **container_options(spec))
        stability = _serve(engine, master, spec.smoke.checks, steps, chats, start=start, port=port, model=model,
                           timeout=spec.smoke.timeout, netns_pid=netns_pid, peers=tuple(started[1:]),
                           asked_here=asked_here)
        statuses = [engine.container_status(name) for name in started]
    except BaseException:
        _clean_up_after_failure(profile, lambda: _remove_all(engine, started, network if made else None), warn)
        raise
    removed = _clean_up_after_failure(profile, lambda: _remove_all(engine, started, network if made else None), warn,
                                      ended="ended")
    if stability:
        steps.append(_stability_of_ranks(statuses))
    _confirm_address(steps, asked_here, removed)
    return GateResult(profile=profile, steps=tuple(steps), chats=tuple(chats),
                      restart_count=sum(s.restart_count for s in statuses),
                      oom_killed=any(s.oom_killed for s in statuses))


def _start_rank(engine: Engine, started: list[str], image: str, *, name: str, **options) -> str:
    """One rank's container, its name in ``started`` before it starts (one started as an interrupt came
    is removed too, by name); not when the engine refused the name: that container is another's."""
    started.append(name)
    try:
        return engine.start(image, [], restarts=RESTARTS, name=name, **options)
    except NameInUse:
        started.pop()
        raise


def _remove_all(engine: Engine, containers: list[str], network: str | None) -> None:
    """Every container, then the network (None: none of ours): each tried even when one before it
    failed (the first failure raised after)."""
    failure: EngineError | None = None
    for container in containers:
        try:
            engine.remove_container(container)
        except EngineError as exc:
            failure = failure or exc
    try:
        if network is not None:
            engine.remove_network(network)
    except EngineError as exc:
        failure = failure or exc
    if failure is not None:
        raise failure


def _clean_up_after_failure(profile: str, clean_up, warn, *, ended: str = "stopped") -> bool:
    """The clean-up of a gate that is failing already (an interrupt, an engine error), or that ended
    (``ended="ended"``): one of its own errors is a warning, never raised, so that the first failure
    is the one passed on (Ctrl-C ends the run with 130, not with the clean-up's exit 1), and a gate
    that ended keeps its result (a container the engine would not remove failed a gate that passed,
    with exit 1)."""
    try:
        clean_up()
    except EngineError as exc:
        warn(f"after the smoke gate of profile {profile} {ended}: {exc}")
        return False
    return True


def _stability_of_ranks(statuses: list[ContainerStatus]) -> GateStep:
    """After the prompts: every rank still running, never restarted, never OOM-killed."""
    problems = []
    for rank, status in enumerate(statuses):
        step = _stability(status)
        if not step.passed:
            problems.append(f"rank {rank}: {step.detail}")
    detail = "; ".join(problems) or f"{len(statuses)} ranks running, 0 restarts, not OOM-killed"
    return GateStep(name="stability", passed=not problems, seconds=0.0, detail=detail)


PROBE_MARGIN = 10.0  # seconds over the probe's own bounds before it is stopped


def _serve(engine: Engine, container: str, checks: tuple[SmokePrompt, ...], steps: list[GateStep],
           chats: list[ChatCheck], *, start: float, port: int, model: str, timeout: int,
           netns_pid: int | None, peers: tuple[str, ...] = (), asked_here: list[str] | None = None) -> bool:
    """The steps on a started container: start, health, every prompt. True when it got to the prompts.
    ``peers``: the other ranks' containers (rank 1 on) of a multi-node gate: one that exits for good
    stops the wait (rank 0 would wait for it until the bound). ``asked_here`` is given the URL the client
    asked from this host's network namespace, under :data:`OWN_NAMESPACE`, where the container's own could
    not be entered (:func:`_nobody_else` then asks it once the container is gone)."""
    running, address, logs = engine.container_state(container)
    for _ in range(50):
        if address or not running:
            break
        time.sleep(0.1)
        running, address, logs = engine.container_state(container)
    if not running or not address:
        status = engine.container_status(container)
        if status.running and not status.restarting:  # up, but the engine gave it no address
            detail = f"the container got no network address within 5 s: {_tail(logs)}"
        else:  # its code and how often the restart policy started it, as for one that exits later
            detail = f"the engine exited at once with code {status.exit_code}{_how(status)}: {_tail(logs)}"
        steps.append(GateStep(name="start", passed=False, seconds=time.monotonic() - start, detail=detail))
        return False
    steps.append(GateStep(name="start", passed=True, seconds=time.monotonic() - start))

    probe = None
    stopped = ""  # why the client was stopped before it ended: the step it was on never finished
    url = f"http://{_host(address)}:{port}"
    netns: int | str | None = netns_pid
    held = None  # the container's own network namespace, open
    if netns_pid == OWN_NAMESPACE:
        held = _own_namespace(engine, container)
        netns = f"/proc/self/fd/{held}" if held is not None else None
        if held is None and asked_here is not None:
            asked_here.append(url)
    try:  # (from the client's start: an interrupt as its prompts' file is closed ends it too)
        with tempfile.TemporaryFile() as prompts:  # (a file, not a pipe: a timed-out wait writes no more to a pipe)
            prompts.write(_probe_input(checks).encode())
            prompts.seek(0)
            with held_signals():  # started and recorded as one step: an interrupt inside Popen (the client made,
                # the object never returned) lands once probe names it, for the finally to end it (it ran on)
                probe = subprocess.Popen(_probe_command(url, model, timeout, netns),
                                         stdin=prompts, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env={**os.environ, "PYTHONPATH": str(PACKAGE_PARENT)},
                                         pass_fds=() if held is None else (held,))
        probe_start = time.monotonic()
        # the client bounds each wait, not a reply that trickles in for ever: the whole probe is bounded here
        # (the health wait, each prompt's own bound, and a margin), and its output read as it comes (a
        # reply bigger than the pipe's buffer would otherwise block the client, and this loop with it)
        limit = timeout + len(checks) * max(MIN_WAIT, timeout) + PROBE_MARGIN
        while True:
            try:
                out, err = probe.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            status = engine.container_status(container)
            gone = not status.running and not status.restarting  # exited for good: the restart policy gave up
            peer = next((rank for rank, c in enumerate(peers, 1) if _gone(engine.container_status(c))), None)
            if gone or peer is not None or time.monotonic() - probe_start > limit:
                probe.kill()
                out, err = probe.communicate()
                if gone:
                    stopped = _exited(status, engine.container_state(container)[2])
                elif peer is not None:
                    ended = engine.container_status(peers[peer - 1])
                    stopped = (f"rank {peer} exited (exit code {ended.exit_code}{_how(ended)}) before rank 0 answered: "
                               f"{_tail(engine.container_state(peers[peer - 1])[2])}")
                else:
                    stopped = f"the engine did not finish answering within {limit:.0f} s (a reply that never ends)"
                break
    finally:
        # however the wait ends (an interrupt: SIGTERM reaches this process alone, an engine error), the
        # client goes with it: left, it would poll a removed container for up to smoke.timeout
        if probe is not None and probe.poll() is None:
            probe.kill()
            probe.communicate()
        if held is not None:
            os.close(held)
    answer = _answer(out, err, complete=not stopped, prompts=len(checks))
    health = answer.get("health")
    if not health:
        detail = stopped or f"{answer.get('error')}; engine log: {_tail(engine.container_state(container)[2])}"
        steps.append(GateStep(name="health", passed=False, seconds=time.monotonic() - probe_start, detail=detail))
        return False
    steps.append(GateStep(name="health", passed=True, seconds=health["seconds"], detail=health["body"][:300]))
    for n, want in enumerate(checks, 1):
        which = f"prompt {n} of {len(checks)}: " if len(checks) > 1 else ""
        if n > len(answer["chats"]):  # the client was stopped on this prompt: the steps after it never ran
            seconds = max(0.0, round(time.monotonic() - probe_start - health["seconds"]
                                     - sum(c.get("seconds", 0.0) for c in answer["chats"]), 3))
            chats.append(ChatCheck(prompt=want.prompt, match=want.match, expect=want.expect, reply="", passed=False,
                                   seconds=seconds))
            steps.append(GateStep(name="chat", passed=False, seconds=seconds, detail=f"{which}{stopped}"))
            return False
        got = answer["chats"][n - 1]
        if "reply" not in got:
            chats.append(ChatCheck(prompt=want.prompt, match=want.match, expect=want.expect, reply="",
                                   passed=False, seconds=got.get("seconds", 0.0)))
            steps.append(GateStep(name="chat", passed=False, seconds=got.get("seconds", 0.0),
                                  detail=f"{which}{got.get('error')}"))
            continue
        why = mismatch(got["reply"], want)
        ok = why is None
        chats.append(ChatCheck(prompt=want.prompt, match=want.match, expect=want.expect, reply=got["reply"][:4096],
                               passed=ok, seconds=got["seconds"]))
        detail = got["reply"][:300] if ok else f"{which}{why}, got {got['reply'][:300]!r}"
        steps.append(GateStep(name="chat", passed=ok, seconds=got["seconds"], detail=detail))
    return True


def _host(address: str) -> str:
    """A container's address as a URL's host: an IPv6 address bracketed (its colons are not a port's)."""
    return f"[{address}]" if ":" in address else address


def _gone(status: ContainerStatus) -> bool:
    """Exited for good: not running, and the restart policy gave up."""
    return not status.running and not status.restarting


def _answer(out: str, err: str, *, complete: bool, prompts: int) -> dict:
    """The client's lines, one per step it finished (the last one cut short when it was stopped)."""
    answer: dict = {"health": None, "chats": []}
    try:
        for line in out.splitlines(keepends=True):
            if not line.endswith("\n") and not complete:
                break  # written as the client was stopped
            step = json.loads(line)
            if "chat" in step:
                answer["chats"].append(step["chat"])
            else:
                answer.update(step)
    except (ValueError, TypeError, RecursionError):  # (RecursionError: a line nested deeper than the stack)
        answer = {}
    if complete and not answer.get("error") and (not answer.get("health") or len(answer["chats"]) != prompts):
        raise EngineError(f"the smoke probe failed: {err.strip()[-300:] or out.strip()[-300:] or 'no output'}")
    return answer


def _tail(logs: str) -> str:
    """The last three different lines: an engine the restart policy started again says the same
    thing each time, and its one error must not fill the line three times."""
    lines = [_short(line.strip()) for line in logs.strip().splitlines() if line.strip()]
    return " | ".join(list(dict.fromkeys(reversed(lines)))[:3][::-1]) or "no output"


def _short(line: str) -> str:
    """One line of the image's output as the gate's error line quotes it: its end, at most TAIL_CHARS (an
    engine that writes a megabyte without a newline must not make the error line, and the --json
    document, a megabyte long)."""
    return line if len(line) <= TAIL_CHARS else "…" + line[-TAIL_CHARS:]


def _exited(status, logs: str) -> str:
    """Why a gate's engine is gone: its exit code, how often it was started, and what it said."""
    return f"the engine exited with code {status.exit_code} before answering{_how(status)}: {_tail(logs)}"


def _how(status: ContainerStatus) -> str:
    """What more an exit code does not say: the kernel killed it for its memory (137 alone reads as any
    SIGKILL, and the stability step that says OOM-killed is never reached), how often it was started."""
    oom = ", OOM-killed (out of memory)" if status.oom_killed else ""
    return oom + (f", started {status.restart_count + 1} times" if status.restart_count else "")


def run_gates(engine: Engine, image: str, metadata: ImageMetadata, *, netns_pid: int | None,
              on_result=lambda result: None, warn=_warn) -> tuple[GateResult, ...]:
    """Every profile's gate, in order; all run, so the notes show each result (a profile with
    ``smoke.skip`` gets a skipped result with its reason, no step). ``warn`` is given what could not
    be cleaned up after a gate that failed (the failure itself is raised). ``netns_pid``: the scratch
    engine's daemon, whose network namespace the client runs in; :data:`OWN_NAMESPACE` for an engine not
    ours (each container's own, see :func:`_serve`); None: the client asks from here, as it is."""
    results = []
    for profile, spec in sorted(metadata.profiles.items()):
        if spec.smoke.skip is not None:  # the profile says why its gate cannot run here: recorded, never passed
            result = GateResult(profile=profile, steps=(), skipped=spec.smoke.skip)
            on_result(result)
            results.append(result)
            continue
        result = run_gate(engine, image, profile, spec, port=metadata.launch.port,
                          model=metadata.launch.model_name, netns_pid=netns_pid, warn=warn)
        on_result(result)
        results.append(result)
    return tuple(results)
