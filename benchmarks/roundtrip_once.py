"""One round trip of an archive written by ``archive_once`` into the engine at ADDRESS (a fresh one):
load, the uncompressed stream's sha256 and the structure re-check, in one read of the archive.

    python -m benchmarks.roundtrip_once FOLDER ADDRESS
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

from unibake.docker_engine import DockerEngine
from unibake.roundtrip import round_trip


def main(argv: list[str]) -> int:
    archive = pickle.loads((Path(argv[0]) / "archive.pickle").read_bytes())
    trip, back = round_trip(archive, DockerEngine(argv[1]))
    print(json.dumps({"seconds": trip.seconds, "image_id": trip.image_id, "sha256": back.uncompressed_sha256}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
