"""An engine in memory, for unit tests of the stages that talk to one (normalise, smoke, the release
pipeline, publish, prune). It keeps images as a config and layer tars, writes ``docker save``
streams in Engine 20.10's layout, and reads ``docker load`` streams with Python's own ``tarfile``,
checking every diffID and the config digest as a real engine does: an implementation independent
of the package's own tar walker, so that tests of our writers are not checked by our readers.
Containers are scripted by the test (``runner`` for ``run``, ``server`` for ``start``).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from unibake.engine import BuildOutcome, ContainerStatus, Engine, ImageInfo, ImageSummary, LoadOutcome, RunOutcome
from unibake.errors import EngineError, NameInUse

# the containers started and not yet removed, in every fake engine, and those removed: the stand-in server of the
# smoke tests (tests/unit/test_smoke.py) does not answer once one was removed and none runs, as an engine's server
# goes with its container (a gate asked from this host checks that nothing answers once its container is removed)
LIVE: set[str] = set()
REMOVED: set[str] = set()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FakeImage:
    config: bytes
    layers: list[bytes]

    @property
    def id(self) -> str:
        return f"sha256:{sha(self.config)}"

    @property
    def parsed(self) -> dict:
        return json.loads(self.config)


@dataclass
class FakeContainer:
    image: str
    env: dict
    image_id: str = ""  # what ``image`` named when it started: a container holds its image, not the tag
    running: bool = True
    address: str = "127.0.0.1"
    logs: str = ""
    restarts: int = 0  # the restart policy it was started with
    restart_count: int = 0  # what the test says happened
    oom_killed: bool = False
    exit_code: int = 0
    network: str | None = None  # a network create_network made, or None: the default bridge
    name: str | None = None
    hosts: dict = field(default_factory=dict)
    ipc: str | None = None  # the IPC mode it was started with (None: the engine's default)
    shm_size: int | None = None  # its /dev/shm in bytes (None: the engine's default)


@dataclass
class FakeEngine(Engine):
    address: str = "fake://engine"
    engine_platform: str = ""  # what the engine says it runs on (linux/amd64); "" says nothing
    images: dict[str, FakeImage] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    containers: dict[str, FakeContainer] = field(default_factory=dict)
    runner: Callable[[str, list[str], dict], RunOutcome] = lambda image, args, env: RunOutcome(exit_code=0, output="ok")
    starter: Callable[[FakeContainer], None] = lambda container: None
    loads: int = 0
    remote: dict[str, FakeImage] = field(default_factory=dict)  # a registry: "repository@digest" -> image
    networks: dict[str, str] = field(default_factory=dict)  # ID -> name, of the networks create_network made

    # --- test helpers ---------------------------------------------------------------------

    def add(self, config: dict, layers: list[bytes], tag: str | None = None) -> str:
        config = {**config, "rootfs": {"type": "layers", "diff_ids": [f"sha256:{sha(x)}" for x in layers]}}
        image = FakeImage(config=json.dumps(config, sort_keys=True).encode(), layers=list(layers))
        self.images[image.id] = image
        if tag:
            self.tags[tag] = image.id
        return image.id

    def _find(self, ref: str) -> FakeImage | None:
        if ref in self.tags:
            return self.images.get(self.tags[ref])
        if ref in self.images:
            return self.images[ref]
        matches = [i for k, i in self.images.items() if k.removeprefix("sha256:").startswith(ref.removeprefix("sha256:"))
                   and len(ref.removeprefix("sha256:")) >= 12]
        return matches[0] if len(matches) == 1 else None

    def layer(self, diff_id: str) -> bytes | None:
        for image in self.images.values():
            for layer in image.layers:
                if f"sha256:{sha(layer)}" == diff_id:
                    return layer
        return None

    # --- the interface ----------------------------------------------------------------------

    def version(self) -> str:
        return "fake-1.0"

    def platform(self) -> str:
        return self.engine_platform

    def build(self, context, *, tag, buildargs, nocache, on_line, platform=None) -> BuildOutcome:
        raise EngineError("the fake engine does not build; engine tests do")

    def inspect_image(self, ref: str) -> ImageInfo | None:
        image = self._find(ref)
        if image is None:
            return None
        config = image.parsed
        inner = config.get("config") or {}
        return ImageInfo(id=image.id, tags=tuple(t for t, i in self.tags.items() if i == image.id),
                         diff_ids=tuple(config["rootfs"]["diff_ids"]), labels=dict(inner.get("Labels") or {}),
                         size=sum(len(x) for x in image.layers), created=config.get("created", ""),
                         env=tuple(inner.get("Env") or ()), architecture=config.get("architecture", ""),
                         os=config.get("os", ""), variant=config.get("variant", ""),
                         onbuild=tuple(inner.get("OnBuild") or ()))

    def history(self, ref: str) -> list[str]:
        image = self._find(ref)
        return [h.get("created_by", "") for h in (image.parsed.get("history") or [])] if image else []

    def save(self, ref: str) -> Iterator[bytes]:
        image = self._find(ref)
        if image is None:
            raise EngineError(f"no such image: {ref}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
            names = []
            for i, layer in enumerate(image.layers):
                folder = sha(f"{i}".encode() + layer)
                _add(tar, f"{folder}/layer.tar", layer)
                _add(tar, f"{folder}/VERSION", b"1.0")
                names.append(f"{folder}/layer.tar")
            _add(tar, f"{image.id[7:]}.json", image.config)
            tags = [t for t, i in self.tags.items() if i == image.id]
            _add(tar, "manifest.json", json.dumps([{"Config": f"{image.id[7:]}.json", "RepoTags": tags,
                                                    "Layers": names}]).encode())
        data = buf.getvalue()
        for i in range(0, len(data), 1 << 16):
            yield data[i:i + (1 << 16)]

    def load(self, chunks: Iterable[bytes], stop=None) -> LoadOutcome:
        self.loads += 1
        data = b"".join(chunks)
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        except tarfile.TarError as exc:
            raise EngineError(f"the engine refused the image: {exc} (engine at {self.address})") from None
        manifest = json.loads(files["manifest.json"])
        loaded_ids, loaded_tags = [], []
        for entry in manifest:
            config = files[entry["Config"]]
            diff_ids = json.loads(config)["rootfs"]["diff_ids"]
            layers = []
            for name, diff_id in zip(entry["Layers"], diff_ids):
                layer = files.get(name)
                if layer is None:
                    layer = self.layer(diff_id)
                    if layer is None:
                        raise EngineError(f"the engine refused the image: layer {diff_id} is missing "
                                          f"(engine at {self.address})")
                if f"sha256:{sha(layer)}" != diff_id:
                    raise EngineError(f"the engine refused the image: layer {name} is not {diff_id} "
                                      f"(engine at {self.address})")
                layers.append(layer)
            image = FakeImage(config=config, layers=layers)
            self.images[image.id] = image
            loaded_ids.append(image.id)
            for tag in entry.get("RepoTags") or []:
                self.tags[tag] = image.id
                loaded_tags.append(tag)
        messages = tuple(f"Loaded image: {t}" for t in loaded_tags) or tuple(f"Loaded image ID: {i}" for i in loaded_ids)
        return LoadOutcome(image_ids=tuple(loaded_ids), tags=tuple(loaded_tags), messages=messages)

    def run(self, image: str, args: list[str], *, env=None, timeout: int = 120, entrypoint=None,
            changes: bool = False) -> RunOutcome:
        if self._find(image) is None:
            raise EngineError(f"running {image} failed: no such image (engine at {self.address})")
        return self.runner(image, list(args), dict(env or {}))

    def start(self, image: str, args: list[str], *, env=None, restarts: int = 0, network=None, name=None,
              hosts=None, ipc=None, shm_size=None) -> str:
        found = self._find(image)
        if network is not None and network not in self.networks and network not in self.networks.values():
            raise EngineError(f"starting {image} failed: network {network} not found (engine at {self.address})")
        if name is not None and any(c.name == name for c in self.containers.values()):
            raise NameInUse(f"starting {image} failed: the name {name} is in use (engine at {self.address})")
        container = FakeContainer(image=image, env=dict(env or {}), restarts=restarts, image_id=found.id if found else "",
                                  network=network, name=name, hosts=dict(hosts or {}), ipc=ipc, shm_size=shm_size)
        self.starter(container)
        cid = sha(f"{len(self.containers)}{image}{name}".encode())
        self.containers[cid] = container
        LIVE.add(cid)
        return cid

    def _container(self, container: str) -> str | None:
        """A container's ID, by its ID or its name."""
        if container in self.containers:
            return container
        return next((cid for cid, c in self.containers.items() if c.name is not None and c.name == container), None)

    def container_state(self, container: str) -> tuple[bool, str, str]:
        c = self.containers[self._container(container)]
        return c.running, c.address if c.running else "", c.logs

    def container_status(self, container: str) -> ContainerStatus:
        c = self.containers[self._container(container)]
        return ContainerStatus(running=c.running, restarting=False, restart_count=c.restart_count, oom_killed=c.oom_killed,
                               exit_code=c.exit_code)

    def remove_container(self, container: str) -> None:
        cid = self._container(container)
        self.containers.pop(cid, None)
        if cid in LIVE:
            LIVE.discard(cid)
            REMOVED.add(cid)

    def create_network(self, name: str) -> str:
        if name in self.networks.values():
            raise NameInUse(f"cannot create network {name}: it exists (engine at {self.address})")
        nid = sha(f"network {name}".encode())
        self.networks[nid] = name
        return nid

    def remove_network(self, network: str) -> None:
        nid = network if network in self.networks else next((k for k, v in self.networks.items() if v == network), None)
        if nid is None:
            return
        if any(c.network in (nid, self.networks[nid]) for c in self.containers.values()):
            raise EngineError(f"cannot remove network {network}: containers use it (engine at {self.address})")
        del self.networks[nid]

    def tag(self, image: str, ref: str) -> None:
        found = self._find(image)
        if found is None:
            raise EngineError(f"cannot tag {image} as {ref}: no such image")
        self.tags[ref] = found.id

    def remove_image(self, ref: str) -> None:
        image = self._find(ref)
        if image is None:
            return
        if ref in self.tags:
            del self.tags[ref]
            if image.id in self.tags.values():
                return
        for t in [t for t, i in self.tags.items() if i == image.id]:
            del self.tags[t]
        self.images.pop(image.id, None)

    def _in_use(self, image_id: str) -> bool:
        return any(c.image_id == image_id for c in self.containers.values())

    def untag(self, ref: str) -> bool:
        image = self._find(ref)
        if image is None:
            return True
        if self._in_use(image.id) and (ref not in self.tags or list(self.tags.values()).count(image.id) == 1):
            return False
        self.remove_image(ref)
        return True

    def remove_if_unused(self, image_id: str) -> bool:
        image = self._find(image_id)
        if image is None:
            return True
        if image.id in self.tags.values() or self._in_use(image.id):
            return False
        self.images.pop(image.id)
        return True

    def pull(self, repository: str, digest: str, auth: dict[str, str] | None, stop=None, progress=None,
             sizes=None) -> None:
        """From ``self.remote``, which a test may share between fakes."""
        image = self.remote.get(f"{repository}@{digest}")
        if image is None:
            raise EngineError(f"the engine could not pull {repository}@{digest}: manifest unknown")
        self.images[image.id] = image
        self.tags[f"{repository}@{digest}"] = image.id

    def list_images(self, *, dangling: bool = False) -> list[ImageSummary]:
        out = []
        for image_id, image in self.images.items():
            tags = tuple(t for t, i in self.tags.items() if i == image_id)
            if dangling and tags:
                continue
            labels = (image.parsed.get("config") or {}).get("Labels") or {}
            out.append(ImageSummary(id=image_id, tags=tags, labels=dict(labels), created=0))
        return out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
