"""Probe (issue 11, goal 2), not a benchmark: can a hotfix's image be assembled from a tiny build and
still be the very image a full build gives? Run on the example product against the real engine:

    flock /tmp/unibake-engine.lock .venv/bin/python -m benchmarks.probe_assembled_hotfix --work /tmp/probe

It releases a copy of the example product (version P1), changes one tune-cache JSON, makes
``hotfix --from P1`` (version P2, a full build: the reference), then builds only the part of the
Dockerfile below the build memo's marker FROM a one-layer base that carries the memo image's config
(its history marked empty but for its last entry, which Engine 20.10 needs: it refuses a config with
more non-empty history entries than layers), with the in-image checks' RUN left out, and asks:

* F1: does the engine load that small base (and how long does it take)?
* F2: are the top layers, once rewritten as normalise rewrites them, the reference's own (their diffIDs)?
* F3: is ``normalised_config`` of the small build's config (the memo's history put back, the in-image
  checks' history entry inserted, the reference's lower diffIDs) the reference's config, i.e. the same
  image ID?
* F4: the same with the small base's copies of the COPY destinations left out (only ``opt/`` and
  ``opt/unibake/``): whose attributes does a COPY's destination folder carry?

It prints each answer and the times, and removes every image it made. The answers as measured are in
benchmarks/NOTES.md (search "probe_assembled_hotfix").
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from unibake.buildmemo import MARKER
from unibake.imagetar import LayerRewriter
from unibake.normalise import normalised_config
from unibake.platforms import parse

REPO = Path(__file__).resolve().parent.parent
EPOCH = 1700000000
SMALL_BASE = "unibake-probe-base:1"
SMALL = "unibake-probe-top:1"


def run(argv, env, what: str) -> str:
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"error: {what} failed:\n{done.stderr[-2000:]}")
    print(f"  {what}: {time.monotonic() - start:.2f} s")
    return done.stdout


def tags() -> list[str]:
    listed = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                            check=True, text=True).stdout.split()
    return [t for t in listed if not t.endswith(":<none>")]


def saved(ref: str) -> tuple[bytes, dict, bytes]:
    data = subprocess.run(["docker", "save", ref], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        entry = json.load(t.extractfile("manifest.json"))[0]
        return t.extractfile(entry["Config"]).read(), entry, data


def small_base(config: dict, history: list, folders: tuple[str, ...]) -> float:
    """Load a one-layer image of ``folders`` (root's, 0755) with ``config``; returns the load's seconds."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name in folders:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            t.addfile(info)
    data = layer.getvalue()
    body = dict(config, history=[{**h, "empty_layer": True} for h in history[:-1]]
                + [{k: v for k, v in history[-1].items() if k != "empty_layer"}],
                rootfs={"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(data).hexdigest()]})
    raw = json.dumps(body).encode()
    name = hashlib.sha256(raw).hexdigest() + ".json"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as t:
        for member, content in ((name, raw), ("layer/layer.tar", data), ("manifest.json", json.dumps(
                [{"Config": name, "RepoTags": [SMALL_BASE], "Layers": ["layer/layer.tar"]}]).encode())):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            t.addfile(info, io.BytesIO(content))
    start = time.monotonic()
    done = subprocess.run(["docker", "load"], input=archive.getvalue(), capture_output=True)
    seconds = time.monotonic() - start
    print(f"  F1: the small base ({len(history)} history entries, 1 layer) loads: "
          f"{'yes' if done.returncode == 0 else 'no: ' + done.stderr.decode().strip()} ({seconds:.2f} s)")
    if done.returncode:
        sys.exit(1)
    return seconds


def probe(work: Path, folders: tuple[str, ...], reference: dict, ref_raw: bytes, memo: dict, env) -> bool:
    memo_config = json.loads(subprocess.run(["docker", "image", "inspect", memo["lower"]], capture_output=True,
                                            check=True, text=True).stdout)[0]
    entries = len(subprocess.run(["docker", "history", "-q", "--no-trunc", memo["lower"]], capture_output=True,
                                 check=True, text=True).stdout.split())
    lower = len(memo_config["RootFS"]["Layers"])
    config = {"architecture": reference["architecture"], "os": reference["os"], "config": memo_config["Config"],
              "created": reference["created"]}
    small_base(config, reference["history"][:entries], folders)
    kit = next((work / "kit").glob("*-kit"))
    context = work / "context"
    if not context.exists():
        context.mkdir()
        subprocess.run(["tar", "-xf", str(kit / "context.tar"), "-C", str(context)], check=True)
    lower_text, upper = (kit / "Dockerfile").read_text().split(MARKER)
    for name, image in zip(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", lower_text, re.M), memo["stages"]):
        upper = re.sub(rf"^(COPY\s+--from=){re.escape(name)}(\s)", rf"\g<1>{image}\2", upper, flags=re.M)
    checks = re.search(r"^RUN (for p in .*)$", upper, re.M).group(1)
    (context / "Dockerfile.small").write_text(f"FROM {SMALL_BASE}\n" + upper.replace(f"RUN {checks}", ""))
    labels = reference["config"]["Labels"]
    run(["docker", "build", "-q", "-f", str(context / "Dockerfile.small"), "-t", SMALL,
         "--build-arg", "UNIBAKE_REVISION=" + labels["org.opencontainers.image.revision"],
         "--build-arg", "UNIBAKE_CREATED=" + labels["org.opencontainers.image.created"], str(context)], env,
        "the small build (the steps below the marker, the checks left out)")
    start = time.monotonic()
    raw, entry, data = saved(SMALL)
    print(f"  its docker save: {time.monotonic() - start:.2f} s, {len(data)} bytes")
    top = []
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for name in entry["Layers"][1:]:
            layer, out = t.extractfile(name).read(), bytearray()
            rewriter = LayerRewriter(epoch=EPOCH, owned="/opt/unibake", emit=out.extend)
            rewriter.write(memoryview(layer))
            rewriter.close()
            top.append("sha256:" + hashlib.sha256(bytes(out) if rewriter.ours else layer).hexdigest())
    same_layers = top == reference["rootfs"]["diff_ids"][lower:]
    print(f"  F2: the {len(top)} top layers, rewritten, are the reference's: {same_layers}")
    built = json.loads(raw)
    history = reference["history"][:entries] + built["history"][entries:]
    at = next(i for i, h in enumerate(history) if "ARG UNIBAKE_REVISION" in h.get("created_by", ""))
    shell = memo_config["Config"].get("Shell") or ["/bin/sh", "-c"]
    history.insert(at, {"created": history[at]["created"], "created_by": " ".join(shell) + " " + checks,
                        "empty_layer": True})
    built["history"] = history
    platform = parse(f"{reference['os']}/{reference['architecture']}", "the reference")[0]
    assembled = normalised_config(json.dumps(built).encode(), reference["rootfs"]["diff_ids"][:lower] + top, EPOCH,
                                  platform)
    want = "sha256:" + hashlib.sha256(normalised_config(ref_raw, reference["rootfs"]["diff_ids"], EPOCH,
                                                        platform)).hexdigest()
    got = "sha256:" + hashlib.sha256(assembled).hexdigest()
    print(f"  F3: the assembled config's digest is the reference's image ID: {got == want} ({got[:19]})")
    subprocess.run(["docker", "rmi", SMALL, SMALL_BASE], capture_output=True)
    return same_layers and got == want


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="a folder for the product copy and the releases")
    args = parser.parse_args()
    work = args.work.resolve()
    if work.exists() and (not work.is_dir() or any(work.iterdir())):  # (it is removed at the start: never a folder
        # of the user's that holds anything)
        raise SystemExit(f"error: --work {work}: give a folder that does not exist, or an empty one")
    (work / "demo").mkdir(parents=True)
    for name in ("profiles", "images"):
        shutil.copytree(REPO / name, work / "demo" / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "CI": "true", "SOURCE_DATE_EPOCH": str(EPOCH)}
    build = [sys.executable, str(REPO / "build.py")]
    profiles, out = work / "demo/profiles", work / "out"
    before = set(tags())
    try:
        run(build + ["--config", str(profiles), "--version", "probe1", "--out", str(out), "--no-smoke"], env,
            "release probe1 (cold)")
        tune = work / "demo/images/tune/tp2/E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3.json"
        tune.write_text(tune.read_text().replace("{", '{"retuned": true, ', 1))
        run(build + ["lock", "--config", str(profiles)], env, "lock")
        run(build + ["hotfix", "--from", "probe1", "--version", "probe2", "--config", str(profiles), "--out", str(out),
                     "--no-smoke"], env, "hotfix probe2 (the reference: a full build)")
        run(build + ["kit", str(out / "probe2"), "--out", str(work / "kit"), "--config", str(profiles)], env, "kit")
        kit = next((work / "kit").glob("*.tar.zst"))
        subprocess.run(f"zstd -qdc '{kit}' | tar -x -C '{work / 'kit'}'", shell=True, check=True)
        image_id = json.loads((out / "probe2/manifest.json").read_text())["image_id"]
        ref_raw, _, _ = saved(image_id)
        memo = json.loads(next((work / "demo/.cache/build-memo").glob("*.json")).read_text())
        ok = True
        for folders in (("opt/", "opt/unibake/", "opt/unibake/engine/", "opt/unibake/profiles/"),
                        ("opt/", "opt/unibake/")):
            print(f"small base holding {', '.join(folders)}:")
            ok = probe(work, folders, json.loads(ref_raw), ref_raw, memo, env) and ok
        return 0 if ok else 1
    finally:
        made = sorted(set(tags()) - before)  # the releases, the build cache's names: the engine left as found
        if made:
            subprocess.run(["docker", "rmi", *made], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
