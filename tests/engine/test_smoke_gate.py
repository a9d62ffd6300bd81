"""The smoke gate of a multi-node profile on a real engine, with a busybox stand-in for a distributed
engine whose rank 0 answers only once every peer has come to MASTER_ADDR:MASTER_PORT: each rank
its own container on a private network (rank 0 reached by its name), in the host engine and in a
scratch engine (its own network namespace, no iptables), and nothing left behind either way."""

from __future__ import annotations

import io
import tarfile
import time
import uuid

import pytest

from unibake.metadata import ImageMetadata
from unibake.scratch import ScratchEngine
from unibake.smoke import OWN_NAMESPACE, container_options, run_gates

GATE_SH = b"""# a distributed engine in busybox: rank 0 answers once every peer came to MASTER_ADDR:MASTER_PORT
case "${1:-serve}" in self-check) echo "self-check[$PROFILE]: ok"; exit 0 ;; esac
if [ "$NODE_RANK" = 0 ]; then
  : > /tmp/peers
  nc -ll -p "$MASTER_PORT" -e /bin/sh /peer.sh &
  echo "rank 0 of $NNODES at $MASTER_ADDR: waiting for the peers"
  while [ "$(wc -l < /tmp/peers)" -lt $((NNODES - 1)) ]; do sleep 0.2; done
  exec nc -ll -p "$PORT" -e /bin/sh /reply.sh
fi
until echo "rank $NODE_RANK" | nc "$MASTER_ADDR" "$MASTER_PORT"; do sleep 0.2; done
exec sleep 3600
"""
PEER_SH = b"""read -r line
echo "$line" >> /tmp/peers
"""
REPLY_SH = b"""read -r method path version
length=0
while read -r line; do
  line=$(printf '%s' "$line" | tr -d '\\r')
  [ -n "$line" ] || break
  case "$line" in [Cc]ontent-[Ll]ength:*) length=$(echo "${line#*:}" | tr -d ' ') ;; esac
done
[ "$length" -gt 0 ] && head -c "$length" > /dev/null
if [ "$path" = /health ]; then
  body='{"status": "ok"}'
else
  body="{\\"choices\\": [{\\"message\\": {\\"content\\": \\"MULTI_OK nodes=$NNODES peers=$(sort /tmp/peers | tr '\\n' ',')\\"}}]}"
fi
printf 'HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: %s\\r\\nConnection: close\\r\\n\\r\\n%s' \\
  "${#body}" "$body"
"""
DOCKERFILE = b"""FROM localhost/unibake-busybox:1
COPY gate.sh peer.sh reply.sh /
ENV PORT=8000
ENTRYPOINT ["/bin/sh", "/gate.sh"]
"""


def built(engine, name: str, files: tuple[tuple[str, bytes], ...]):
    """An image built from ``files`` (its Dockerfile among them) under a tag of its own, removed after."""
    tag = f"{name}:{uuid.uuid4().hex[:10]}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    engine.build(buf, tag=tag, buildargs={}, nocache=False, on_line=lambda line: None)
    yield tag
    engine.remove_image(tag)


@pytest.fixture(scope="module")
def distributed(engine):
    yield from built(engine, "unibake-test-smoke-nodes", (("Dockerfile", DOCKERFILE), ("gate.sh", GATE_SH),
                                                          ("peer.sh", PEER_SH), ("reply.sh", REPLY_SH)))


def metadata(nodes: int) -> ImageMetadata:
    return ImageMetadata.model_validate({
        "product": "nodes", "version": "1", "tag": "nodes:1", "default_profile": "tp8", "components": [],
        "launch": {"port": 8000, "model_name": "demo", "mounts": {}},
        "profiles": {"tp8": {"gpus": 1, "vendor": "nvidia", "kernels": [], "tune_caches": 0, "sidecars": [],
                             "args": [], "topology": {"nodes": nodes, "network": "host", "master_port": 20000},
                             "smoke": {"timeout": 30, "prompts": [
                                 {"prompt": "Say it.", "expect": f"MULTI_OK nodes={nodes} peers="
                                  + "".join(f"rank {r}," for r in range(1, nodes))}]}}}}, strict=False)


def state(engine) -> tuple[set, set]:
    return ({c["Id"] for c in engine.api.containers(all=True)}, {n["Id"] for n in engine.api.networks()})


def test_every_rank_starts_on_a_private_network_and_rank_0_answers_in_the_host_engine(engine, distributed):
    # (before: rank 0 alone with MASTER_ADDR=127.0.0.1, waiting for its peers until /health timed out)
    before = state(engine)
    result = run_gates(engine, distributed, metadata(3), netns_pid=None)[0]
    assert result.passed, result.steps
    assert [s.name for s in result.steps] == ["self-check", "start", "health", "chat", "stability"]
    assert result.steps[-1].detail == "3 ranks running, 0 restarts, not OOM-killed"
    assert state(engine) == before  # every rank and the network removed


def test_every_rank_starts_on_a_private_network_in_a_scratch_engine(engine, distributed, tmp_path):
    with ScratchEngine(tmp_path / "scratch") as scratch:
        scratch.engine.load(engine.save(distributed))
        result = run_gates(scratch.engine, distributed, metadata(2), netns_pid=scratch.pid)[0]
        assert result.passed, result.steps
        assert state(scratch.engine)[0] == set()
        assert {n["Name"] for n in scratch.engine.api.networks()} == {"bridge", "host", "none"}


@pytest.mark.parametrize("topology, ipc, shm_kib", [({"ipc": "private", "shm_size": "512m"}, "private", 524288),
                                                    ({"ipc": "shareable"}, "shareable", 65536)])
def test_a_gate_container_gets_the_profiles_ipc_mode_and_shm_size_from_the_engine(engine, topology, ipc, shm_kib):
    # (before: every gate's container had the engine's default IPC and a /dev/shm of 64 MiB, whatever the profile)
    document = metadata(1).model_dump()
    document["profiles"]["tp8"]["topology"] = topology
    spec = ImageMetadata.model_validate(document, strict=False).profiles["tp8"]
    before = state(engine)
    container = engine.start("localhost/unibake-busybox:1", ["sh", "-c", "df -k /dev/shm; sleep 60"],
                             name=f"unibake-test-shm-{uuid.uuid4().hex[:10]}", **container_options(spec))
    try:
        for _ in range(100):
            logs = engine.container_state(container)[2]
            if "/dev/shm" in logs:
                break
            time.sleep(0.1)
        assert engine.api.inspect_container(container)["HostConfig"]["IpcMode"] == ipc
        assert logs.split()[-5] == str(shm_kib), logs  # df -k: Filesystem 1K-blocks Used Available Use% Mounted on
    finally:
        engine.remove_container(container)
    assert state(engine) == before


ONE_SH = b"""case "${1:-serve}" in self-check) echo "self-check[$PROFILE]: ok"; exit 0 ;; esac
echo "serving $REPLY"
exec nc -ll -p "$PORT" -e /bin/sh /reply.sh
"""
ONE_DOCKERFILE = b"""FROM localhost/unibake-busybox:1
COPY one.sh reply.sh /
ENV PORT=8000 REPLY=REAL_OK NODE_RANK=0 NNODES=1
VOLUME /data
ENTRYPOINT ["/bin/sh", "/one.sh"]
"""


@pytest.fixture(scope="module")
def single(engine):
    """A one-node engine that answers REPLY (its env), with an anonymous volume (VOLUME /data)."""
    reply = REPLY_SH.split(b"if [", 1)[0] + b"""if [ "$path" = /health ]; then
  body='{"status": "ok"}'
else
  body="{\\"choices\\": [{\\"message\\": {\\"content\\": \\"$REPLY\\"}}]}"
fi
printf 'HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: %s\\r\\nConnection: close\\r\\n\\r\\n%s' \\
  "${#body}" "$body"
"""
    yield from built(engine, "unibake-test-smoke-one", (("Dockerfile", ONE_DOCKERFILE), ("one.sh", ONE_SH),
                                                        ("reply.sh", reply)))


def one_node(expect: str) -> ImageMetadata:
    document = metadata(1).model_dump()
    document["profiles"]["tp8"]["topology"] = {}
    document["profiles"]["tp8"]["smoke"] = {"timeout": 30, "prompts": [{"prompt": "Say it.", "expect": expect}]}
    return ImageMetadata.model_validate(document, strict=False)


def test_a_verify_engine_s_gate_asks_its_own_container_not_another_engine_s_at_the_same_address(engine, single,
                                                                                                 tmp_path):
    # found by review: with --verify-engine the client asked the gate container's bridge address from this host's
    # network namespace. A scratch engine's bridge is 172.17.0.0/16 as this host's docker0 is: its first container
    # and the host engine's first container both get 172.17.0.2, and the host engine's (here a decoy answering
    # DECOY_OK) answered for the image. The client now runs in the gate container's own namespace
    decoy = engine.start(single, [], env={"REPLY": "DECOY_OK"}, name=f"unibake-test-decoy-{uuid.uuid4().hex[:10]}")
    try:
        with ScratchEngine(tmp_path / "scratch") as scratch:
            scratch.engine.load(engine.save(single))
            volumes = len(scratch.engine.api.volumes().get("Volumes") or [])
            result = run_gates(scratch.engine, single, one_node("DECOY_OK"), netns_pid=OWN_NAMESPACE)[0]
            assert not result.passed and result.failed.name == "chat", result.steps
            assert result.failed.detail == "expected exactly 'DECOY_OK', got 'REAL_OK'"  # its own reply, not the decoy's
            result = run_gates(scratch.engine, single, one_node("REAL_OK"), netns_pid=OWN_NAMESPACE)[0]
            assert result.passed, result.steps
            assert [s.name for s in result.steps] == ["self-check", "start", "health", "chat", "stability"]
            # nothing left there, its anonymous volumes neither (before: two a gate, the self-check's and the server's)
            assert state(scratch.engine)[0] == set()
            assert len(scratch.engine.api.volumes().get("Volumes") or []) == volumes
    finally:
        engine.remove_container(decoy)
