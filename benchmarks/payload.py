"""A deterministic, seeded payload shaped like an inference image, built into an image on the engine.

What inference images hold, by share of bytes: weight-like blobs that do not compress (60 %),
ELF-like shared libraries that compress about 3:1 (28 %), Python sources (8 %) and JSON tune
caches (4 %); one layer each, on the busybox base.
"""

from __future__ import annotations

import json
import random
import tarfile
import tempfile
from pathlib import Path

SHARES = {"weights": 0.60, "libs": 0.28, "python": 0.08, "tune": 0.04}
FILE_SIZE = {"weights": 256 << 20, "libs": 24 << 20, "python": 48 << 10, "tune": 24 << 10}
BASE = "localhost/unibake-busybox:1"


def _weights(rng: random.Random, size: int) -> bytes:
    return b"".join(rng.randbytes(min(1 << 20, size - i)) for i in range(0, size, 1 << 20))


def _library(rng: random.Random, size: int, snippets: list[bytes]) -> bytes:
    out = bytearray(b"\x7fELF\x02\x01\x01" + bytes(57))
    while len(out) < size:  # a 4 KiB page: reused code, some unique bytes, alignment padding
        page = b"".join(rng.choice(snippets) for _ in range(5)) + rng.randbytes(1024)
        out += page + bytes(4096 - len(page) % 4096)
    return bytes(out[:size])


def _python(rng: random.Random, size: int) -> bytes:
    words = ["tensor", "rank", "shard", "kv_cache", "attention", "logits", "sampler", "batch", "stream", "block"]
    lines = ['"""Generated module of the benchmark payload."""', "from __future__ import annotations", ""]
    n, length = 0, sum(len(x) + 1 for x in lines)  # kept as lines are added: re-summing them is quadratic
    while length < size:
        a, b = rng.choice(words), rng.choice(words)
        more = [f"def {a}_{b}_{n}(x, {b}=None):", f"    \"\"\"Return {a} of {b}.\"\"\"",
                f"    return [v * {rng.randint(1, 999)} for v in x if v is not {b}]", ""]
        lines += more
        length += sum(len(x) + 1 for x in more)
        n += 1
    return ("\n".join(lines) + "\n").encode()[:size]


def _tune(rng: random.Random, size: int) -> bytes:
    table, m, length = {}, 1, 2  # len(json.dumps(table)), kept as entries are added: re-dumping is quadratic
    while length < size:
        entry = {"BLOCK_SIZE_M": rng.choice([16, 32, 64]), "BLOCK_SIZE_N": rng.choice([64, 128]),
                 "GROUP_SIZE_M": rng.choice([1, 8, 16]), "num_warps": rng.choice([4, 8]),
                 "num_stages": rng.choice([2, 3, 4])}
        length += len(json.dumps(str(m))) + len(": ") + len(json.dumps(entry)) + (len(", ") if table else 0)
        table[str(m)] = entry
        m += 1
    return json.dumps(table, indent=1).encode()


def write_payload(folder: Path, total: int, seed: int) -> None:
    rng = random.Random(seed)
    snippets = [rng.randbytes(512) for _ in range(64)]
    for kind, share in SHARES.items():
        budget = int(total * share)
        sub = folder / kind
        sub.mkdir(parents=True)
        n = 0
        while budget > 0:
            size = min(FILE_SIZE[kind], budget)
            if kind == "weights":
                data = _weights(rng, size)
            elif kind == "libs":
                data = _library(rng, size, snippets)
            elif kind == "python":
                data = _python(rng, size)
            else:
                data = _tune(rng, size)
            suffix = {"weights": ".bin", "libs": ".so", "python": ".py", "tune": ".json"}[kind]
            (sub / f"{kind}-{n:04d}{suffix}").write_bytes(data)
            budget -= len(data)
            n += 1


def ensure_image(engine, total: int, seed: int = 2026) -> str:
    """The payload image of ``total`` bytes; built once, then found by its tag."""
    tag = f"unibake-bench:{total}-s{seed}"
    if engine.inspect_image(tag) is not None:
        return tag
    dockerfile = f"FROM {BASE}\n" + "".join(f"COPY {k}/ /opt/payload/{k}/\n" for k in SHARES)
    with tempfile.TemporaryDirectory(prefix="unibake-bench-") as tmp:
        root = Path(tmp)
        write_payload(root / "ctx", total, seed)
        (root / "ctx" / "Dockerfile").write_text(dockerfile)
        with tempfile.TemporaryFile(dir=tmp) as context:
            with tarfile.open(fileobj=context, mode="w") as tar:
                tar.add(root / "ctx", arcname=".")
            context.seek(0)
            engine.build(context, tag=tag, buildargs={}, nocache=False, on_line=lambda line: None)
    return tag
