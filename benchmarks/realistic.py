"""The realistic product and the compressible payload, made from what every machine of this kind has on
disk: the PyTorch CPU wheel in /opt/wheels (a wheel is a zip).

    base     localhost/unibake-demo-base:bookworm + the unpacked wheel in dist-packages     (about 0.86 GB)
    product  the example product (profiles/, images/) on that base, with the wheel's
             torch/lib/libtorch_cpu.so (0.43 GB) added to its engine folder              (about 1.31 GB)
    libs     the compressible payload: copies of the unpacked wheel (shared libraries, executables,
             Python, headers; zstd -3 ratio about 4), one layer per copy, on the busybox base

Images are built once and found by their tag afterwards; the wheel's members are streamed from the
zip into the build context, never unpacked on disk. ``--quick`` uses :func:`stand_in_wheel`, a few
MB shaped like the real one.
"""

from __future__ import annotations

import hashlib
import io
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import yaml

from benchmarks.payload import BASE as BUSYBOX, _library, _python

ROOT = Path(__file__).resolve().parent.parent
WHEELS = Path("/opt/wheels")
DEMO_BASE = "localhost/unibake-demo-base:bookworm"
SITE = "/usr/local/lib/python3.11/dist-packages"  # Debian bookworm's python3 is 3.11, as the wheel is
LIB = "torch/lib/libtorch_cpu.so"
ENGINE_LIB = "images/engine/lib/libtorch_cpu.so"  # where it goes in the product: the engine folder
PRODUCT = "bench-llm"  # its own name, so the example's build-cache tags (unibake-cache/demo-llm:*) stay untouched
TUNE = "images/tune/tp2/E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3.json"
MTIME = 1700000000


def find_wheel(folder: Path = WHEELS) -> Path:
    """The PyTorch CPU wheel on this machine; an error naming the folder when there is none."""
    found = sorted(folder.glob("torch-*cpu*.whl")) if folder.is_dir() else []
    if not found:
        raise SystemExit(f"error: no PyTorch CPU wheel (torch-*cpu*.whl) in {folder}; the realistic product is "
                         "made from it (or use --quick, which makes a stand-in)")
    return found[-1]


def stand_in_wheel(folder: Path, lib_bytes: int = 8 << 20, seed: int = 2026) -> Path:
    """A small wheel shaped like the real one (a big ELF-like libtorch_cpu.so, smaller libraries, Python
    sources, headers), for ``--quick``: every code path runs, at a few MB."""
    rng = random.Random(seed)
    snippets = [rng.randbytes(512) for _ in range(64)]
    path = folder / "torch-0.0.0+standin-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        members = {LIB: _library(rng, lib_bytes, snippets), "torch/lib/libc10.so": _library(rng, 1 << 20, snippets),
                   "torch/__init__.py": _python(rng, 64 << 10), "torch/nn/modules.py": _python(rng, 256 << 10),
                   "torch/include/ATen/ops.h": _python(rng, 128 << 10), "torch/bin/protoc": _library(rng, 512 << 10,
                                                                                                      snippets)}
        for name, data in sorted(members.items()):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith((".so", "protoc")) else 0o644) << 16
            z.writestr(info, data, zipfile.ZIP_DEFLATED)
    return path


def wheel_digest(wheel: Path) -> str:
    """The first 12 hex digits of the wheel's sha256: what the images made from it are tagged by."""
    h = hashlib.sha256()
    with open(wheel, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()[:12]


def _files(z: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    return sorted((i for i in z.infolist() if not i.is_dir()), key=lambda i: i.filename)


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, MTIME
    tar.addfile(info)


def _add_member(tar: tarfile.TarFile, z: zipfile.ZipFile, member: zipfile.ZipInfo, name: str,
                limit: int | None = None) -> int:
    """One zip member into the tar, streamed (at most ``limit`` bytes of it); returns the bytes added."""
    info = tarfile.TarInfo(name)
    info.size = member.file_size if limit is None else min(member.file_size, limit)
    info.mode, info.mtime = (member.external_attr >> 16) & 0o777 or 0o644, MTIME
    with z.open(member) as src:
        tar.addfile(info, src)  # tarfile reads exactly info.size bytes from src
    return info.size


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, MTIME
    tar.addfile(info, io.BytesIO(data))


def _build(engine, tag: str, fill) -> None:
    """Build ``tag`` from a context tar that ``fill(tar)`` writes (a temporary file, not memory)."""
    with tempfile.TemporaryFile(prefix="unibake-bench-") as context:
        with tarfile.open(fileobj=context, mode="w", format=tarfile.PAX_FORMAT) as tar:
            fill(tar)
        context.seek(0)
        engine.build(context, tag=tag, buildargs={}, nocache=False, on_line=lambda line: None)


def ensure_base(engine, wheel: Path) -> str:
    """The realistic base: the demo base with the unpacked wheel in dist-packages; built once, then
    found by its tag."""
    tag = f"unibake-bench-torch-base:{wheel_digest(wheel)}"
    if engine.inspect_image(tag) is not None:
        return tag

    def fill(tar: tarfile.TarFile) -> None:
        _add_text(tar, "Dockerfile", f"FROM {DEMO_BASE}\nCOPY site/ {SITE}/\n")
        with zipfile.ZipFile(wheel) as z:
            dirs = set()
            for member in _files(z):
                parts = f"site/{member.filename}".split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = "/".join(parts[:i])
                    if d not in dirs:
                        dirs.add(d)
                        _add_dir(tar, d)
                _add_member(tar, z, member, f"site/{member.filename}")

    _build(engine, tag, fill)
    return tag


def ensure_libs_image(engine, total: int, wheel: Path) -> str:
    """The compressible payload of ``total`` bytes: copies of the unpacked wheel, one layer per copy
    (the last one cut short), on the busybox base; built once, then found by its tag."""
    tag = f"unibake-bench-libs:{total}-{wheel_digest(wheel)}"
    if engine.inspect_image(tag) is not None:
        return tag
    copies: list[str] = []

    def fill(tar: tarfile.TarFile) -> None:
        budget = total
        with zipfile.ZipFile(wheel) as z:
            members = _files(z)
            while budget > 0:
                copy = f"c{len(copies)}"
                copies.append(copy)
                dirs = set()
                for member in members:
                    if budget <= 0:
                        break
                    parts = f"{copy}/{member.filename}".split("/")[:-1]
                    for i in range(1, len(parts) + 1):
                        d = "/".join(parts[:i])
                        if d not in dirs:
                            dirs.add(d)
                            _add_dir(tar, d)
                    budget -= _add_member(tar, z, member, f"{copy}/{member.filename}", limit=budget)
        _add_text(tar, "Dockerfile", f"FROM {BUSYBOX}\n" + "".join(f"COPY {c}/ /opt/payload/{c}/\n" for c in copies))

    _build(engine, tag, fill)
    return tag


def lay_out_product(dest: Path, base_tag: str, wheel: Path) -> Path:
    """The example product copied to ``dest`` with its base replaced by ``base_tag``, its name by
    :data:`PRODUCT`, and the wheel's libtorch_cpu.so in its engine folder; locked. Returns its profiles folder."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "profiles", dest / "profiles")
    shutil.copytree(ROOT / "images", dest / "images", ignore=shutil.ignore_patterns("__pycache__"))
    product_yaml = dest / "profiles" / "product.yaml"
    # Rewritten as data, not text: the example's layout (one-line or block keys) may change freely.
    doc = yaml.safe_load(product_yaml.read_text())
    for key in ("product", "base"):
        if key not in doc:  # the example product changed shape: say so rather than measure something else
            raise SystemExit(f"error: {product_yaml}: no top-level '{key}' to replace")
    doc["product"] = PRODUCT
    doc["base"] = {"image": base_tag}  # amd64 only: the wheel's base has no other platform
    product_yaml.write_text(yaml.safe_dump(doc, sort_keys=False))
    lib = dest / ENGINE_LIB
    lib.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z, z.open(LIB) as src, open(lib, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    lib.chmod(0o755)
    lock(dest / "profiles")
    return dest / "profiles"


def lock(profiles: Path) -> None:
    """``build.py lock``: the product's inputs.lock rewritten after a change."""
    run = subprocess.run([sys.executable, str(ROOT / "build.py"), "--quiet", "lock", "--config", str(profiles)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"error: build.py lock --config {profiles} failed: {run.stderr.strip()[-1000:]}")


def set_tune(profiles: Path, mark: str | None) -> None:
    """One tune-cache JSON of tp2 changed (``mark`` makes each change distinct; None restores the
    example's file), and the lock rewritten."""
    path = profiles.parent / TUNE
    original = (ROOT / TUNE).read_text()
    path.write_text(original if mark is None else original.replace("{", f'{{"retuned": "{mark}", ', 1))
    lock(profiles)
