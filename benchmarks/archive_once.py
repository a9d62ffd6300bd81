"""One run of our archive stage on an image, for the benchmark (run as a child, so its peak RSS is its own).

    python -m benchmarks.archive_once IMAGE FOLDER [--long] [--no-inspect | --inspect-root DIR] [--engine-save]
Prints JSON: compressed and uncompressed bytes, the stage's own seconds, the seconds of the sha256 of the
archive it wrote (the stage takes no digest of the archive: a release's round trip reads it back and
hashes it; the peer's ``| tee FILE | sha256sum`` does, so the benchmark compares the stage plus that
digest with the peer), its peak RSS, how many libraries it inspected, and where the image was read ("store": the engine's storage; "save": its
``docker save``). As in the pipeline, the image is read from the engine's storage where this process
can read it (unibake.layerstore), else through the save; --engine-save always reads the save (the
release option of that name). The layers are read for the SBOM in the same pass (libraries hashed
under /opt/unibake, or DIR); --no-inspect leaves that out, to measure what it costs.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
import time
from pathlib import Path

from unibake.archive import write_archive
from unibake.contents import LayerInspector
from unibake.docker_engine import DockerEngine
from unibake.layerstore import FROM_STORE, archive_image


def peak_rss_mib() -> int:
    """This process's own peak RSS (VmHWM). Not the parent's ru_maxrss of the child: that counts the
    memory of the process that forked it, which the kernel carries over to the child at exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise SystemExit("error: /proc/self/status has no VmHWM line")


def main(argv: list[str]) -> int:
    image, folder = argv[0], Path(argv[1])
    root = argv[argv.index("--inspect-root") + 1] if "--inspect-root" in argv else "/opt/unibake"
    engine = DockerEngine()
    info = engine.inspect_image(image)
    if info is None:
        raise SystemExit(f"error: the engine has no image {image}")
    source = ["save"]
    archive = archive_image(
        engine, image, image_id=info.id, use_store="--engine-save" not in argv,
        on_source=lambda where: source.__setitem__(0, "store" if where.startswith(FROM_STORE) else "save"),
        on_fallback=lambda why: (source.__setitem__(0, "save"), print(f"warning: {why}", file=sys.stderr)),
        write=lambda chunks: write_archive(chunks, folder, "image.tar.zst", tag=image, long_distance="--long" in argv,
                                           inspector=None if "--no-inspect" in argv else LayerInspector(root)))
    start = time.monotonic()
    with open(folder / "image.tar.zst", "rb") as written:
        digest = hashlib.file_digest(written, "sha256").hexdigest()
    digest_seconds = time.monotonic() - start
    (folder / "archive.pickle").write_bytes(pickle.dumps(archive))
    print(json.dumps({"bytes": archive.compressed_bytes, "uncompressed": archive.uncompressed_bytes,
                      "seconds": archive.seconds, "digest_seconds": digest_seconds, "sha256": digest,
                      "peak_rss_mib": peak_rss_mib(),
                      "libraries": len(archive.contents.libraries) if archive.contents else None,
                      "source": source[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
