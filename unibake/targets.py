"""Releasing for several platforms at once, and the base image's platform checked before a build.

``build.py --platform linux/amd64,linux/arm64`` (or ``platform: linux/amd64,linux/arm64`` in
product.yaml) makes one image and one release folder per platform (``release/1.3.1/`` and
``release/1.3.1-arm64/``), each a complete release that verifies on its own. Every platform is
built, archived, round-tripped and gated before any folder is published: both releases or none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace

from .builder import image_platform
from .console import Reporter
from .engine import Engine
from .errors import EngineError, InputError, UnibakeError
from .pipeline import Connect, Request, Results, Stage, docker_engines, run_stages
from .plan import ReleasePlan
from .publish import CommitGroup, ReleaseFolder
from .schema import TOPOLOGY_ENV
from .platforms import EXEC_FORMAT, MACHINES, Platform, emulation_hint


def check_base(engine: Engine, plan: ReleasePlan) -> None:
    """Every image the Dockerfile builds FROM must be in the engine (the build would try to pull it and
    fail at that step with the registry's error), and the base image must record the plan's platform:
    a foreign base would be relabelled, not rebuilt."""
    for role, image in plan.from_images:
        if image != "scratch" and engine.inspect_image(image) is None:
            raise InputError(f"{role} {image} is not in the engine ({engine.address}): unibake builds on local "
                             f"images and pulls none; load it (docker load, or docker pull {image}), then build "
                             "again (scripts/setup.sh makes the example's); nothing was built")
    info = engine.inspect_image(plan.base_image)
    if info is None:
        return  # FROM scratch
    found = image_platform(info)
    if found and found != plan.platform.name:
        raise InputError(f"the base image {plan.base_image} is {found}, not {plan.platform.name}: set "
                         f"base.platforms.{plan.platform.name} in product.yaml to a {plan.platform.name} image "
                         "(scripts/setup.sh makes the example's)")
    # labels pass from the base into the image: one of unibake's own (a kernel, a component, the
    # metadata) would then describe the release as if unibake had set it
    ours = sorted(k for k in info.labels or {} if k.startswith("io.unibake."))
    if ours:
        raise InputError(f"the base image {plan.base_image} carries unibake's own labels ({', '.join(ours)[:200]}): "
                         "they would pass into the release as if unibake had set them; build on an image without "
                         "them (a released image is not a base: use hotfix --from for a release on a release)")
    # the entrypoint sets PROFILE and each profile's own env only where the container's environment
    # has no value, so that `docker run -e` overrides them: a value in the base's config counts as
    # given, and the container would run with the base's value (or profile) while the notes record the
    # profile's. (What every profile sets alike is the image's ENV, over the base's.)
    given = {entry.split("=", 1)[0] for entry in info.env or ()}
    owned = {"PROFILE": "the default profile"}
    common = plan.env_common
    for p in plan.profiles:
        for key in p.env:
            if key not in common:
                owned.setdefault(key, f"profile {p.name}'s env")
        if p.topology.nodes > 1:
            for key, source in TOPOLOGY_ENV.items():
                owned.setdefault(key, f"profile {p.name}'s {source}")
    clash = sorted(set(owned) & given)
    if clash:
        which = "; ".join(f"{k} ({owned[k]})" for k in clash[:5]) + (f"; and {len(clash) - 5} more" if len(clash) > 5
                                                                   else "")
        raise InputError(f"the base image {plan.base_image} sets {which} in its environment (ENV): the release's "
                         "entrypoint gives a profile's value only where none is set, so the container would run "
                         "with the base's value while the notes record the profile's; build on a base without "
                         "them, or drop them from the profile")


def check_emulation(engine: Engine, plan: ReleasePlan) -> None:
    """A platform the engine runs only under emulation (not this machine's): one program of its base
    image is run first, so that an engine whose host has no emulator for it is said before anything
    is built (else the build fails at its first RUN step, after every platform before it was built)."""
    if MACHINES.get(os.uname().machine) == plan.platform or engine.inspect_image(plan.base_image) is None:
        return  # natively here (or the build names the missing image)
    try:
        # the shell itself: a base's ENTRYPOINT (an inference server) would run for the whole timeout
        said = engine.run(plan.base_image, [], entrypoint=["/bin/sh", "-c", "true"], timeout=60).output
    except EngineError as exc:
        said = str(exc)
    if EXEC_FORMAT in said:
        raise UnibakeError(f"the engine at {engine.address} cannot run the {plan.platform.name} base image "
                           f"{plan.base_image} ({EXEC_FORMAT}); {emulation_hint(plan.platform.name)}; nothing was "
                           "built")


def run_platforms(stages: Sequence[Stage], request: Request, platforms: Sequence[Platform], reporter: Reporter, *,
                  connect: Connect | None = None) -> list[Results]:
    """``stages`` once per platform; publishing (when selected) waits until every platform has passed
    everything before it, so a failure on one platform publishes nothing. Every platform is planned
    and its base images checked before any is built (an arm64 base missing is not found after the
    amd64 image was built, exported and gated)."""
    names = [s.name for s in stages]
    first = names.index("build") if "build" in names else len(names)
    planning, before = stages[:first], [s for s in stages[first:] if s.name != "publish"]
    after = [s for s in stages if s.name == "publish"]
    requests = [replace(request, platform=p.name) for p in platforms]
    with ExitStack() as stack:  # every release folder and scratch engine is held until the end
        # what refuses a platform before any work (its plan; its release folder, when it exists and no
        # --force; its base images; an engine that cannot run its programs) runs for every platform first
        planned = []
        for n, one in enumerate(requests, 1):
            reporter.info(f"==> platform {one.platform} ({n} of {len(requests)}): plan")
            planned.append(run_stages(planning, one, reporter, connect=connect, stack=stack, builds=bool(before)))
        if before:
            plans = [results.get("plan") for results in planned]
            engine = (connect or docker_engines(request))(request.engine) if any(plans) else None
            for plan in filter(None, plans):
                check_base(engine, plan)
            for plan in filter(None, plans):
                check_emulation(engine, plan)
        done = []
        for n, (one, results) in enumerate(zip(requests, planned), 1):
            reporter.info(f"==> platform {one.platform} ({n} of {len(requests)})")
            done.append(run_stages(before, one, reporter, connect=connect, stack=stack, given=results)
                        if before else results)
        if not after:
            return done
        # each folder is written whole first; then all are renamed at once: both releases or none
        group = CommitGroup()
        for results in done:
            folder = results.get("folder")
            if isinstance(folder, ReleaseFolder):
                folder.group = group
        published = [run_stages(after, one, reporter, connect=connect, stack=stack, given=results)
                     for one, results in zip(requests, done)]
        group.commit()
        return published
