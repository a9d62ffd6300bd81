"""The smoke gate of every profile, on the image as loaded in the verify engine.

For each profile: ``self-check`` passes; the engine starts with that ``PROFILE``; ``/health``
answers; a chat completion contains the profile's expected reply. The HTTP client runs in the
verify engine's network namespace (the scratch engine's bridge is invisible from here otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .engine import Engine
from .errors import EngineError
from .manifest import GateResult, GateStep
from .metadata import ImageMetadata, ProfileMetadata

PACKAGE_PARENT = Path(__file__).resolve().parent.parent  # what makes ``unibake`` importable


def _probe_command(url: str, prompt: str, model: str, timeout: int, netns_pid: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "unibake.smoke_client", url, prompt, model, str(timeout)]
    if netns_pid is not None:
        cmd = ["nsenter", f"--net=/proc/{netns_pid}/ns/net", "--"] + cmd
    return cmd


def run_gate(engine: Engine, image: str, profile: str, spec: ProfileMetadata, *, port: int, model: str,
             netns_pid: int | None) -> GateResult:
    """One profile's gate; stops at the first step that fails."""
    steps: list[GateStep] = []
    smoke = spec.smoke
    timeout = smoke.timeout

    start = time.monotonic()
    check = engine.run(image, ["self-check"], env={"PROFILE": profile}, timeout=max(120, timeout))
    tail = " ".join(check.output.strip().splitlines()[-2:])
    steps.append(GateStep(name="self-check", passed=check.exit_code == 0, seconds=time.monotonic() - start,
                          detail="" if check.exit_code == 0 else f"exit {check.exit_code}: {tail}"))
    if check.exit_code != 0:
        return GateResult(profile=profile, steps=tuple(steps))

    start = time.monotonic()
    container = engine.start(image, [], env={"PROFILE": profile})
    try:
        running, address, logs = engine.container_state(container)
        for _ in range(50):
            if address or not running:
                break
            time.sleep(0.1)
            running, address, logs = engine.container_state(container)
        if not running or not address:
            steps.append(GateStep(name="start", passed=False, seconds=time.monotonic() - start,
                                  detail=f"the engine exited at once: {_tail(logs)}"))
            return GateResult(profile=profile, steps=tuple(steps))
        steps.append(GateStep(name="start", passed=True, seconds=time.monotonic() - start))

        probe = subprocess.Popen(_probe_command(f"http://{address}:{port}", smoke.prompt, model, timeout, netns_pid),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": str(PACKAGE_PARENT)})
        probe_start = time.monotonic()
        while probe.poll() is None:
            running, _, logs = engine.container_state(container)
            if not running:
                probe.kill()
                probe.wait()
                steps.append(GateStep(name="health", passed=False, seconds=time.monotonic() - probe_start,
                                      detail=f"the engine exited before answering: {_tail(logs)}"))
                return GateResult(profile=profile, steps=tuple(steps))
            time.sleep(0.2)
        out, err = probe.communicate()
        try:
            result = json.loads(out)
        except ValueError:
            raise EngineError(f"the smoke probe failed: {err.strip()[-300:] or out.strip()[-300:]}") from None
        health = result.get("health")
        if not health:
            steps.append(GateStep(name="health", passed=False, seconds=time.monotonic() - probe_start,
                                  detail=f"{result.get('error')}; engine log: {_tail(engine.container_state(container)[2])}"))
            return GateResult(profile=profile, steps=tuple(steps))
        steps.append(GateStep(name="health", passed=True, seconds=health["seconds"],
                              detail=json.dumps(health["body"], sort_keys=True)))
        chat = result.get("chat")
        expect = smoke.expect_reply
        if not chat:
            steps.append(GateStep(name="chat", passed=False, seconds=0.0, detail=str(result.get("error"))))
        else:
            ok = expect is None or expect in chat["reply"]
            detail = chat["reply"][:300] if ok else f"expected {expect!r} in the reply, got {chat['reply'][:300]!r}"
            steps.append(GateStep(name="chat", passed=ok, seconds=chat["seconds"], detail=detail))
        return GateResult(profile=profile, steps=tuple(steps))
    finally:
        engine.remove_container(container)


def _tail(logs: str) -> str:
    lines = [line for line in logs.strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:]) or "no output"


def run_gates(engine: Engine, image: str, metadata: ImageMetadata, *, netns_pid: int | None,
              on_result=lambda result: None) -> tuple[GateResult, ...]:
    """Every profile's gate, in order; all run, so the notes show each result."""
    results = []
    for profile, spec in sorted(metadata.profiles.items()):
        result = run_gate(engine, image, profile, spec, port=metadata.launch.port,
                          model=metadata.launch.model_name, netns_pid=netns_pid)
        on_result(result)
        results.append(result)
    return tuple(results)
