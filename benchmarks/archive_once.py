"""One run of our archive stage on an image, for the benchmark (run as a child, so its peak RSS is its own).

    python -m benchmarks.archive_once IMAGE FOLDER [--long] [--no-inspect | --inspect-root DIR]
Prints JSON: compressed and uncompressed bytes, the stage's own seconds, its peak RSS, and how many
libraries it inspected. As in the pipeline, the layers are read for the SBOM in the same pass
(libraries hashed under /opt/unibake, or DIR); --no-inspect leaves that out, to measure what it costs.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

from unibake.archive import write_archive
from unibake.contents import LayerInspector
from unibake.docker_engine import DockerEngine


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
    inspector = None if "--no-inspect" in argv else LayerInspector(root)
    archive = write_archive(DockerEngine().save(image), folder, "image.tar.zst", tag=image,
                            long_distance="--long" in argv, inspector=inspector)
    (folder / "archive.pickle").write_bytes(pickle.dumps(archive))
    print(json.dumps({"bytes": archive.compressed_bytes, "uncompressed": archive.uncompressed_bytes,
                      "seconds": archive.seconds, "peak_rss_mib": peak_rss_mib(),
                      "libraries": len(archive.contents.libraries) if archive.contents else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
