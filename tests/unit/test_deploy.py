"""Deploy's own logic over fake engines: parallel, a row per engine, past a failure, idempotent;
the hosts file and the command line's bad input."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import docker
import pytest


from unibake.deploy import Plan, deploy, engines_of, raise_if_failed, read_hosts
from unibake.errors import EngineError, InputError, VerificationError
from unibake.manifest import load_manifest

from ..conftest import REPO
from ..fake_engine import FakeEngine
from .test_publish import make_release


def fleet(*names):
    engines = {f"tcp://{n}:2375": FakeEngine(address=f"tcp://{n}:2375") for n in names}

    def connect(address):
        if address not in engines:
            raise EngineError(f"cannot reach the Docker engine at {address}: no engine listens there")
        return engines[address]
    return engines, connect


def test_every_engine_gets_the_release_a_broken_one_is_a_row_and_a_second_run_skips(tmp_path):
    folder, image_id = make_release(tmp_path / "release")
    m = load_manifest(folder)
    engines, connect = fleet("a", "b", "c")
    addresses = ["tcp://a:2375", "tcp://gone:2375", "tcp://b:2375", "tcp://c:2375"]
    plan = Plan(folder=folder, manifest=m, source="archive")
    seen = []
    results = deploy(plan, addresses, connect, jobs=3, on_result=seen.append)
    assert [(r.engine, r.result) for r in results] == [(addresses[0], "loaded"), (addresses[1], "failed"),
                                                      (addresses[2], "loaded"), (addresses[3], "loaded")]
    assert sorted(seen, key=lambda r: addresses.index(r.engine)) == results  # (each said as it ended)
    assert "no engine listens there" in results[1].detail
    for engine in engines.values():
        assert engine.inspect_image(m.tag).id == image_id and engine.loads == 1
    with pytest.raises(VerificationError, match=r"1 of 4 engines failed: tcp://gone:2375: cannot reach"):
        raise_if_failed(results)

    again = deploy(plan, addresses, connect)
    assert [r.result for r in again] == ["skipped", "failed", "skipped", "skipped"]
    assert all(e.loads == 1 for e in engines.values())

    engines["tcp://a:2375"].tags.pop(m.tag)  # the image is there but its tag was removed
    assert deploy(plan, ["tcp://a:2375"], connect)[0].result == "tagged"
    assert engines["tcp://a:2375"].inspect_image(m.tag).id == image_id
    raise_if_failed(deploy(plan, ["tcp://a:2375", "tcp://b:2375"], connect))


def test_an_engine_that_ends_up_with_another_image_fails_its_row(tmp_path):
    folder, image_id = make_release(tmp_path / "release")
    m = load_manifest(folder)
    engines, connect = fleet("a")
    other = FakeEngine()
    other_id = other.add({"config": {}}, [b"x"])
    engines["tcp://a:2375"].remote = {f"r.example/a@sha256:{'1' * 64}": other.images[other_id]}

    def pull(engine, stop, advance):
        engine.pull("r.example/a", f"sha256:{'1' * 64}", None)
        engine.tag(other_id, m.tag)
        return other_id
    results = deploy(Plan(folder=folder, manifest=m, source="registry", pull=pull), ["tcp://a:2375"], connect)
    assert results[0].result == "failed" and f"image ID {other_id} after the pull, not {image_id}" in results[0].detail


class SlowEngine(FakeEngine):
    """An engine whose load takes each piece of the stream a while after asking for it (``pause``
    seconds; none: as fast as a FakeEngine); ``taken`` counts the pieces it took."""

    def __init__(self, *args, pause=0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.pause, self.taken = pause, 0

    def load(self, chunks, stop=None):
        def slowly():
            for chunk in chunks:
                self.taken += 1
                yield chunk
                time.sleep(self.pause)
        time.sleep(0.3 if self.pause else 0)
        return super().load(slowly())


def test_an_interrupt_breaks_off_the_loads_under_way_and_says_which_engines_hold_the_release(tmp_path):
    """Ctrl-C once the first engine is done: the second engine's load is broken off at once (before:
    waited for to its end, however long, and the interrupt said only "interrupted"); the interrupt
    names the engine that holds the release."""
    folder, image_id = make_release(tmp_path / "release", layers=[bytes(4 << 20)] * 3)
    m = load_manifest(folder)
    engines, connect = fleet()
    engines["tcp://a:2375"] = a = SlowEngine(address="tcp://a:2375", pause=0)
    engines["tcp://slow:2375"] = slow = SlowEngine(address="tcp://slow:2375")

    def ctrl_c(result):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt) as caught:
        deploy(Plan(folder=folder, manifest=m, source="archive"), ["tcp://a:2375", "tcp://slow:2375"], connect,
               on_result=ctrl_c)
    # broken off at once: measured in the pieces the slow engine took (0.5 s each; the whole stream is
    # what a took), not in seconds from the start, which a loaded machine stretches (1.5 s flaked)
    assert a.taken > 2 >= slow.taken, (a.taken, slow.taken)
    assert str(caught.value) == "tcp://a:2375 holds the release (checked); tcp://slow:2375 does not (its load was " \
                                "broken off)"
    assert engines["tcp://a:2375"].inspect_image(m.tag).id == image_id
    assert slow.inspect_image(m.tag) is None


def test_each_engine_s_row_is_said_as_it_ends_not_after_every_engine_named_before_it(tmp_path):
    # the rows were said in the order the engines were given: a slow first engine (a big load, a node that
    # stops answering until --engine-timeout) held back the word of every engine after it, so a deploy to
    # many nodes printed nothing for minutes though most of them were done
    folder, image_id = make_release(tmp_path / "release", layers=[bytes(4 << 20)] * 3)
    m = load_manifest(folder)
    engines, connect = fleet("a", "b")
    engines["tcp://slow:2375"] = SlowEngine(address="tcp://slow:2375")
    addresses = ["tcp://slow:2375", "tcp://a:2375", "tcp://b:2375"]
    said = []
    results = deploy(Plan(folder=folder, manifest=m, source="archive"), addresses, connect, jobs=3,
                     on_result=lambda r: said.append((r.engine, engines["tcp://slow:2375"].inspect_image(m.tag))))
    assert [r.engine for r in results] == addresses and all(r.result == "loaded" for r in results)
    assert sorted(engine for engine, _ in said[:2]) == ["tcp://a:2375", "tcp://b:2375"]
    assert said[0][1] is None and said[1][1] is None  # said while the slow engine was still loading
    assert said[2][0] == "tcp://slow:2375"


@contextmanager
def silent_engine():
    """An address that takes connections and never answers (a wrong port, a hung daemon)."""
    server = socket.create_server(("127.0.0.1", 0))
    taken = []

    def accept():
        try:
            while True:
                taken.append(server.accept()[0])
        except OSError:
            return
    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in taken:
            conn.close()


def test_a_deploy_stuck_on_an_engine_that_never_answers_ends_at_the_third_interrupt(tmp_path):
    """As the README says of every command: the second interrupt is let be, the third cuts the
    clean-up short (before: nothing but SIGKILL ended it, the stuck worker was waited for)."""
    folder, _ = make_release(tmp_path / "release")
    with silent_engine() as address:
        run = subprocess.Popen([sys.executable, str(REPO / "build.py"), "deploy", str(folder), "--engine", address],
                               stderr=subprocess.PIPE, text=True)
        lines, deploying, let_be = [], threading.Event(), threading.Event()

        def read():
            for line in run.stderr:
                lines.append(line)
                if line.startswith("==> deploy"):
                    deploying.set()
                if line.startswith("warning: still cleaning up after the interrupt"):
                    let_be.set()
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        # started, verified, and waiting on the engine (on a loaded machine a fixed 3 s could end in the
        # verify: the run then ended at the first signal, and a later one found no handler: exit -15)
        assert deploying.wait(60), "".join(lines)
        time.sleep(0.5)
        run.send_signal(signal.SIGTERM)
        # the second: sent again until the run says it let it be (two signals that reach a loaded process
        # before its handler ran are one: three sent 0.3 s apart could be two, and the run never ended)
        for _ in range(5):
            time.sleep(0.3)
            run.send_signal(signal.SIGTERM)
            if let_be.wait(10) or run.poll() is not None:
                break
        assert let_be.is_set() and run.poll() is None, "".join(lines)  # the second interrupt is let be
        run.send_signal(signal.SIGTERM)
        try:
            code = run.wait(10)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
            pytest.fail("deploy did not end at the third interrupt")
        reader.join(10)
        err = "".join(lines)
    assert code == 130, err
    # found by probing: it said no more than "error: interrupted"; the engine let go is named as under way
    assert err.splitlines()[-1] == "error: interrupted: no engine got the release (still under way, let go)", err


def test_the_hosts_file_and_the_engines_given(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# nodes\nssh://root@node1\n\n  tcp://10.0.0.2:2376  # the second\nunix:///run/docker.sock\n")
    assert read_hosts(hosts) == ["ssh://root@node1", "tcp://10.0.0.2:2376", "unix:///run/docker.sock"]
    assert engines_of(["ssh://root@node0"], read_hosts(hosts))[0] == "ssh://root@node0"
    hosts.write_text("ssh://root@node1\nnode2\n")
    with pytest.raises(InputError, match=rf"{hosts}:2: 'node2' is not an engine address"):
        read_hosts(hosts)
    hosts.write_text("# nothing\n")
    with pytest.raises(InputError, match="no engine address"):
        read_hosts(hosts)
    with pytest.raises(InputError, match="named twice"):
        engines_of(["ssh://a", "ssh://a"], [])
    with pytest.raises(InputError, match=r"engine ssh://root@NODE1:22 is named twice \(as ssh://root@node1\)"):
        engines_of(["ssh://root@node1"], ["ssh://root@NODE1:22"])  # the hosts file names an --engine again
    for one, again in (("unix:///var/run/docker.sock", "unix:///var/run//docker.sock"),  # one socket, two spellings
                       ("tcp://h:2375", "tcp://h:02375"), ("tcp://[::1]:2375", "tcp://[::1]:2375/")):
        with pytest.raises(InputError, match=rf"engine {re.escape(again)} is named twice"):
            engines_of([one, again], [])
    sock = tmp_path / "docker.sock"
    sock.write_text("")
    (tmp_path / "run").symlink_to(tmp_path)  # /var/run is a link to /run on most systems
    with pytest.raises(InputError, match="named twice"):
        engines_of([f"unix://{sock}", f"unix://{tmp_path / 'run' / 'docker.sock'}"], [])
    assert len(engines_of(["tcp://h:2375", "tcp://h:2376", "ssh://h:2222", "ssh://h"], [])) == 4
    with pytest.raises(InputError, match="at least one engine"):
        engines_of([], [])


def test_a_unix_address_of_two_slashes_is_the_socket_docker_py_connects_to_and_odd_ones_are_refused(cli, tmp_path):
    # found by probing: unix://tmp/a.sock is /tmp/a.sock to docker-py, but was told apart by "tmp" alone: a second
    # engine under /tmp was dropped without a word, and unix:///x and unix://x were two engines, each loaded; port 0
    # over ssh and a unix address naming no socket were a traceback (exit 1)
    a, b = tmp_path / "a.sock", tmp_path / "b.sock"
    assert len(engines_of([f"unix:/{a}", f"unix:/{b}"], [])) == 2
    with pytest.raises(InputError, match=rf"engine unix:/{re.escape(str(a))} is named twice \(as unix://{a}\)"):
        engines_of([f"unix://{a}", f"unix:/{a}"], [])
    folder, _ = make_release(tmp_path / "release")
    for address in ("ssh://u@h:0", "ssh://h:00", "unix://@", "unix://:1", "unix:///"):
        result = cli("deploy", str(folder), "--engine", address)
        assert result.code == 2 and len(result.error_lines) == 1 and "Traceback" not in result.err, result.err
        assert result.error_lines[0].startswith(f"error: --engine: '{address}' is not an engine address"), result.err
    hosts = tmp_path / "hosts"
    hosts.write_text("ssh://h:0\n")
    result = cli("deploy", str(folder), "--hosts", str(hosts))
    assert result.code == 2 and result.error_lines == [
        f"error: {hosts}:1: 'ssh://h:0' is not an engine address (unix:///path, tcp://host:port or ssh://user@host): "
        "it names no host, or a port no connection can use"], result.err


def test_a_hosts_file_s_lines_are_those_newlines_end_as_an_editor_counts_them(tmp_path):
    # found by probing: str.splitlines() also ends a line at a form feed or U+2028: two engines on one line, and the
    # line numbers of every error after it off
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"unix:///tmp/a\xe2\x80\xa8tcp://x:1\r\nunix:///tmp/b\x0cunix:///tmp/a\n")
    with pytest.raises(InputError, match=rf"^{re.escape(str(hosts))}:1: 'unix:///tmp/a\\u2028tcp://x:1' is not an "
                                         "engine address"):
        read_hosts(hosts)
    hosts.write_text("tcp://x:1\r\ntcp://y:1\r\n\r\ntcp://x:1\r\n")
    with pytest.raises(InputError, match=rf"^{re.escape(str(hosts))}:4: engine tcp://x:1 is named twice \(line 1\)"):
        read_hosts(hosts)


def test_an_engine_a_hosts_file_names_twice_is_refused_naming_the_file_and_its_lines(cli, tmp_path):
    # "error: engine tcp://Node2:2375 is named twice (as tcp://node2:2375)": no word of the hosts file, nor of
    # which of its hundred lines to fix
    folder, _ = make_release(tmp_path / "release")
    hosts = tmp_path / "nodes.txt"
    hosts.write_text("tcp://node1:2375\ntcp://node2:2375  # rack 1\n\ntcp://node3:2375\ntcp://Node2:2375/\n")
    result = cli("deploy", str(folder), "--hosts", str(hosts))
    assert result.code == 2 and result.error_lines == [
        f"error: {hosts}:5: engine tcp://Node2:2375/ is named twice (line 2 as tcp://node2:2375); name each engine "
        "once"], result.err
    hosts.write_text("tcp://node1:2375\ntcp://node2:2375\n")
    result = cli("deploy", str(folder), "--hosts", str(hosts), "--engine", "tcp://NODE2:2375")
    assert result.code == 2 and result.error_lines == [
        f"error: --hosts {hosts}: engine tcp://node2:2375 is given as --engine tcp://NODE2:2375 too; name each "
        "engine once"], result.err


@pytest.mark.parametrize("args, message", [
    (["deploy", "{folder}"], "deploy needs at least one engine"),
    (["deploy", "{folder}", "--engine", "ssh://a:b:c"], "Port could not be cast to integer"),
    (["deploy", "{folder}", "--engine", "tcp://a:99999"], "Port out of range"),
    (["deploy", "{folder}", "--engine", "tcp://a:1", "--jobs", "0"], "--jobs 0 must be 1 or more"),
    (["deploy", "{folder}", "--engine", "tcp://a:1", "--from", "registry"], "records no push"),
    (["deploy", "{folder}", "--engine", "tcp://a:1", "--ref", "r.example/a@sha256:" + "0" * 64],
     "--ref goes with --from registry"),
    (["push", "{folder}", "--to", "demo-llm"], "is not REGISTRY/REPOSITORY"),
    (["push", "{folder}", "--to", "team/demo-llm"], "names no registry host"),
    (["push", "{folder}", "--to", "localhost:99999/t/bb"], "out of range 1..65535"),
    (["push", "{folder}", "--to", "localhost:5000/t/bb:t\u00e5g"], "is not REGISTRY/REPOSITORY"),
    (["pull", "team/demo-llm@sha256:" + "0" * 64], "names no registry host"),
    (["push", "{folder}", "--to", "r.example/a", "--retries", "-1"], "--retries -1 is out of range 0..20"),
    (["push", "{folder}", "--to", "r.example/a", "--retries", "21"], "--retries 21 is out of range 0..20"),
    (["push", "{folder}", "--to", "r.example/a", "--ca-file", "/nonexistent/ca.crt"], "no such file"),
    (["pull", "r.example/a:1"], "names no digest"),
    (["pull", "r.example/a@sha256:" + "0" * 64, "--out", "{out}"], "no release under"),
    (["pull", "r.example/a@sha256:" + "0" * 64, "--pull-deadline", "0"], "--pull-deadline 0 is out of range 1..604800"),
    (["deploy", "{folder}", "--engine", "tcp://a:1", "--pull-deadline", "60"], "--pull-deadline goes with --from "
                                                                               "registry"),
])
def test_bad_input_is_exit_2_before_anything_is_reached(cli, tmp_path, args, message):
    folder, _ = make_release(tmp_path / "release")
    result = cli(*[a.format(folder=folder, out=tmp_path / "release") for a in args])
    assert result.code == 2, result.err
    assert message in result.error_lines[-1]


def test_a_tampered_manifest_is_not_pulled_against(cli, tmp_path):
    folder, _ = make_release(tmp_path / "release")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["image_id"] = "sha256:" + "0" * 64
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = cli("pull", "r.example/a@sha256:" + "0" * 64, "--release", str(folder))
    assert result.code == 3 and "differs from SHA256SUMS" in result.error_lines[-1]


@pytest.mark.parametrize("before, after, env, engines", [
    (["--engine", "unix:///nonexistent/a.sock"], ["--engine", "unix:///nonexistent/b.sock"], {},
     ["unix:///nonexistent/a.sock", "unix:///nonexistent/b.sock"]),
    (["--engine", "unix:///nonexistent/a.sock"], ["--engine", "unix:///nonexistent/a.sock"], {},
     ["unix:///nonexistent/a.sock"]),
    ([], [], {"DOCKER_HOST": "unix:///nonexistent/env.sock"}, ["unix:///nonexistent/env.sock"]),
    # one engine however its address is written: a trailing slash, the host's case
    ([], ["--engine", "tcp://127.0.0.1:1", "--engine", "tcp://127.0.0.1:1/"], {}, ["tcp://127.0.0.1:1"]),
    (["--engine", "tcp://Node1.example:1"], ["--engine", "tcp://node1.example:1/"], {}, ["tcp://Node1.example:1"]),
    ([], ["--engine", "unix:///nonexistent/b.sock"], {"DOCKER_HOST": "unix:///nonexistent/env.sock"},
     ["unix:///nonexistent/b.sock"]),
])
def test_deploy_goes_to_every_engine_named_before_or_after_the_command_else_docker_host(cli, tmp_path, before, after,
                                                                                          env, engines):
    folder, _ = make_release(tmp_path / "release")
    result = cli("--json", *before, "deploy", str(folder), *after, env={"CI": "true", **env})
    assert result.code == 3, result.err  # no engine there: each one a failed row, none left out
    assert [row["engine"] for row in json.loads(result.out)["engines"]] == engines


def test_a_hotfix_from_the_registry_needs_no_base_in_the_engine_from_its_archive_it_does(tmp_path):
    from ..fake_engine import FakeImage
    from ..savefixtures import config_for, layer_tar
    from .test_hotfix import hotfix_of

    out = tmp_path / "release"
    shared, new = layer_tar({"base": b"base" * 100}), layer_tar({"new": b"new" * 100})
    base, _ = make_release(out, "1.0", layers=[shared, layer_tar({"old": b"old" * 100})])
    m = load_manifest(hotfix_of(out, base))
    whole = FakeImage(config=config_for([shared, new]), layers=[shared, new])  # the push sends every layer
    assert whole.id == m.image_id
    engines, connect = fleet("a")
    engines["tcp://a:2375"].remote = {f"r.example/demo-llm@sha256:{'1' * 64}": whole}

    def pull(engine, stop, advance):
        engine.pull("r.example/demo-llm", f"sha256:{'1' * 64}", None)
        engine.tag(whole.id, m.tag)
        return whole.id
    refused = deploy(Plan(folder=out / "1.1", manifest=m, source="archive"), ["tcp://a:2375"], connect)[0]
    assert refused.result == "failed" and "this hotfix needs release 1.0" in refused.detail
    pulled = deploy(Plan(folder=out / "1.1", manifest=m, source="registry", pull=pull), ["tcp://a:2375"], connect)[0]
    assert pulled.result == "pulled", pulled.detail  # was refused as if the archive were loaded
    assert engines["tcp://a:2375"].inspect_image(m.tag).id == m.image_id


def test_a_deploy_load_that_brings_another_image_leaves_that_engine_as_it_was(tmp_path):
    """The archive swapped after deploy checked it (another image, tagged as the release and as an
    image the engine holds): the load is refused (its stream's end held back till its hash matched),
    and an engine that loads other bytes than it is fed has what it tagged put back, as verify
    --load does (before: a failed row, the other image left tagged as the release and the victim)."""
    from ..forge import also_tagging_the_victim, forge
    from ..savefixtures import docker_layout, layer_tar

    folder, image_id = make_release(tmp_path / "release")
    m = load_manifest(folder)

    other = make_release(tmp_path / "other", layers=[layer_tar({"opt/app/x": b"not the release\n"})])[0]
    forge(other, also_tagging_the_victim)
    engines, connect = fleet("a")
    engine = engines["tcp://a:2375"]
    victim = engine.add({"architecture": "amd64", "os": "linux", "config": {}}, [b""], tag="victim:1")
    original = (folder / m.archive.name).read_bytes()
    (folder / m.archive.name).write_bytes((other / m.archive.name).read_bytes())
    result = deploy(Plan(folder=folder, manifest=m, source="archive"), ["tcp://a:2375"], connect)[0]
    assert result.result == "failed" and "changed after it was checked" in result.detail, result.detail
    assert engine.tags == {"victim:1": victim} and list(engine.images) == [victim]

    (folder / m.archive.name).write_bytes(original)

    class Rogue(FakeEngine):
        def load(self, chunks, stop=None):
            list(chunks)
            data = docker_layout([layer_tar({"o": b"other\n"})], tag=m.tag)[0]
            first = super().load([data])
            self.tags["victim:1"] = self.tags[m.tag]
            return type(first)(image_ids=first.image_ids, tags=first.tags + ("victim:1",), messages=first.messages)

    rogue = Rogue(address="tcp://rogue:2375")
    victim = rogue.add({"architecture": "amd64", "os": "linux", "config": {}}, [b""], tag="victim:1")
    result = deploy(Plan(folder=folder, manifest=m, source="archive"), ["tcp://rogue:2375"], lambda a: rogue)[0]
    assert result.result == "failed" and "what the load tagged was put back" in result.detail, result.detail
    assert rogue.tags == {"victim:1": victim} and list(rogue.images) == [victim]


def test_a_deploy_that_moves_the_release_tag_off_another_image_says_so(tmp_path):
    # the engine's demo-llm:1.3.1 was another image (a build of the same version): the load and the
    # tag moved it to the release's image and the row said only "checked"
    folder, image_id = make_release(tmp_path / "release")
    m = load_manifest(folder)
    engines, connect = fleet("a", "b")
    plan = Plan(folder=folder, manifest=m, source="archive")
    deploy(plan, ["tcp://b:2375"], connect)
    engines["tcp://b:2375"].tag(image_id, "copy:1")
    for engine in engines.values():
        other = engine.add({"architecture": "amd64", "os": "linux", "config": {}}, [b"a local build"], tag=m.tag)
    results = deploy(plan, ["tcp://a:2375", "tcp://b:2375"], connect)
    assert [r.result for r in results] == ["loaded", "tagged"]
    for r in results:
        assert r.detail.endswith(f"; {m.tag} named {other[:19]}... before"), r.detail
    assert all(e.inspect_image(m.tag).id == image_id for e in engines.values())


def pullable(tmp_path):
    """An engine (b) that can pull a release's image by a registry reference (engine a holds it): the engine, the
    reference, the release's manifest, what the registry would say of it, and the image ID."""
    from unibake.registry import ManifestInfo, parse_reference

    folder, image_id = make_release(tmp_path / "release")
    m = load_manifest(folder)
    engines, connect = fleet("a", "b")
    deploy(Plan(folder=folder, manifest=m, source="archive"), ["tcp://a:2375"], connect)
    ref = parse_reference(f"r.example/demo-llm@sha256:{'1' * 64}", what="ref", digest=True)
    engine = engines["tcp://b:2375"]
    engine.remote = {ref.pinned: engines["tcp://a:2375"].images[image_id]}
    return engine, ref, m, ManifestInfo(media_type="", config_digest=image_id, compressions=frozenset({"gzip"})), \
        image_id


def test_a_pull_that_moves_the_release_tag_off_another_image_says_so(tmp_path):
    # pull tagged the pulled image as the release without a word, where deploy's row said
    # "TAG named X before"
    from unibake.registry import pull_into

    engine, ref, m, info, image_id = pullable(tmp_path)
    warned = []
    assert pull_into(engine, ref, m, info, None, warn=warned.append) == image_id
    assert warned == []  # the tag named nothing before
    other = engine.add({"architecture": "amd64", "os": "linux", "config": {}}, [b"a local build"], tag=m.tag)
    assert pull_into(engine, ref, m, info, None, warn=warned.append) == image_id
    assert warned == [f"{m.tag} named {other[:19]}... before; it names release {m.release}'s image now"]
    assert engine.inspect_image(m.tag).id == image_id
    pull_into(engine, ref, m, info, None, warn=warned.append)
    assert len(warned) == 1  # already the release's image: nothing to say


def test_credentials_handed_to_an_engine_reached_without_tls_are_said_to_cross_the_network(tmp_path):
    # found by review: pull and deploy --from registry gave every engine the registry password, tcp:// engines
    # without TLS too, and nothing said that it crossed the network as it is
    from unibake.docker_engine import in_the_clear
    from unibake.registry import Credentials, pull_into

    for address in ("tcp://10.0.0.7:2375", "http://gpu01:2375", "tcp://[fd00::7]:2375", "tcp://user@gpu01:2375/"):
        assert in_the_clear(address, None), address
    for address, tls in (("tcp://10.0.0.7:2376", object()), ("tcp://127.0.0.1:2375", None), ("tcp://:2375", None),
                         ("tcp://localhost:2375", None), ("tcp://[::1]:2375", None), ("unix:///run/docker.sock", None),
                         ("ssh://me@gpu01", None)):
        assert not in_the_clear(address, tls), address
    engine, ref, m, info, image_id = pullable(tmp_path)
    login = Credentials(username="ci", password="s3cret", source="/home/ci/.docker/config.json")
    said = []
    engine.in_the_clear = True
    assert pull_into(engine, ref, m, info, login, on_clear=said.append) == image_id
    assert said == ["the engine at tcp://b:2375 is reached without TLS: the registry credentials it is given for the "
                    "pull (from /home/ci/.docker/config.json) cross the network as they are; set DOCKER_TLS_VERIFY "
                    "(and DOCKER_CERT_PATH) for a tcp:// engine on port 2376, or give it a pull-only account"]
    pull_into(engine, ref, m, info, None, on_clear=said.append)  # no credentials handed: nothing to say
    engine.in_the_clear = False
    pull_into(engine, ref, m, info, login, on_clear=said.append)
    assert len(said) == 1 and "s3cret" not in said[0]


class EngineAPI(http.server.BaseHTTPRequestHandler):
    """A fake engine's API handler: HTTP/1.1 (docker-py keeps its connection), nothing logged."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass


REAL_API_CLIENT = docker.APIClient.__init__  # (taken before the unit tests' guard replaces it)


@pytest.fixture
def fake_api_only(monkeypatch):
    """docker-py's client let through to :func:`docker_api`'s fake engines on loopback (the unit tests'
    guard refuses every engine; these tests name only fake ones)."""
    def checked(self, *args, base_url=None, **kwargs):
        assert base_url and base_url.startswith("tcp://127.0.0.1:"), base_url
        REAL_API_CLIENT(self, *args, base_url=base_url, **kwargs)
    monkeypatch.setattr(docker.APIClient, "__init__", checked)


@contextmanager
def _serving(handler):
    """``handler`` (an http.server handler: a fake engine's API) served on loopback, each request in a
    thread of its own; yields the tcp:// address docker-py reaches it by."""
    import http.server

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


ENGINE_VERSION = {"ApiVersion": "1.41", "Version": "20.10.24", "MinAPIVersion": "1.12"}


def _json_reply(handler, status, document):
    """``document`` sent as a fake engine's JSON answer (with its length) by ``handler``."""
    body = json.dumps(document).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _version_reply(handler):
    """A fake engine's answer to GET /version, docker-py's first request: Engine 20.10 (API 1.41)."""
    _json_reply(handler, 200, ENGINE_VERSION)


def _events_reply(handler, events):
    """A fake engine's streamed answer (a pull's, a load's): each event a chunk of its own, as the engine sends them."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for event in events:
        data = json.dumps(event).encode() + b"\r\n"
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.write(b"0\r\n\r\n")


@contextmanager
def docker_api(*, inspect="404", pull="progress"):
    """A Docker engine's API on loopback, as docker-py reaches it over tcp://: it answers the version, then
    ``inspect``: "404" (no such image) or "silent" (takes the request and says nothing, as a hung daemon);
    a pull (POST /images/create): "progress" (an event every 0.1 s, as a long pull), "silent" after its
    first event, or "late": nothing at all, not even its headers (an engine still reaching the registry).
    Yields (address, what it saw: "pull broken off" once a pull's client went away)."""

    seen, ended = [], threading.Event()

    class Engine(EngineAPI):

        def do_GET(self):  # noqa: N802 - http.server's names
            if self.path.endswith("/version"):
                return _version_reply(self)
            if self.path.split("?")[0].endswith("/images/json"):
                return _json_reply(self, 200, [])
            if inspect == "silent":
                seen.append("inspect held")
                ended.wait(60)
                return
            _json_reply(self, 404, {"message": "No such image"})

        def do_POST(self):  # noqa: N802
            if "/images/load" in self.path:  # takes the request, then none of the stream
                seen.append("load held")
                ended.wait(60)
                return
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("X-Registry-Auth"):
                seen.append(f"credentials {self.headers['X-Registry-Auth']}")
            if pull == "late":  # no word yet (the engine still reaching the registry): not even its headers
                seen.append("pull held")
                ended.wait(60)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            seen.append("pull began")
            try:
                while not ended.is_set():
                    event = b'{"status":"Downloading","id":"0123456789ab"}\r\n'
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                    if pull == "silent":
                        ended.wait(60)
                        return
                    time.sleep(0.1)
            except OSError:
                seen.append("pull broken off")

    with _serving(Engine) as address:
        try:
            yield address, seen
        finally:
            ended.set()


def _within(seconds, call):
    """``call()``'s result or error, or pytest.fail when it is still running after ``seconds``."""
    outcome = []

    def run():
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test as it is
            outcome.append(exc)
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"still waiting after {seconds} s")
    return outcome[0]


def test_an_engine_that_answers_then_stops_answering_is_a_failed_row_after_the_engine_timeout(cli, tmp_path,
                                                                                             fake_api_only):
    """An engine that answered the first request (its version) and then took each request and said
    nothing held each of deploy's requests for an hour (the timeout of a build's silent steps), a pull's
    stream without end. deploy now waits --engine-timeout (default 600 s) for any word, then fails that
    engine's row naming it and the option."""
    from unibake.docker_engine import DockerEngine

    folder, _ = make_release(tmp_path / "release")
    with docker_api(inspect="silent") as (address, seen):
        result = _within(30, lambda: cli("--json", "deploy", str(folder), "--engine", address, "--engine-timeout", "2"))
    assert result.code == 3, result.err
    row = json.loads(result.out)["engines"][0]
    assert row["result"] == "failed" and re.fullmatch(
        r"cannot inspect sha256:[0-9a-f]{64}: the engine stopped answering: nothing from it in 2 s "
        rf"\(--engine-timeout\) \(engine at {re.escape(address)}\)", row["detail"]), row["detail"]
    assert seen == ["inspect held"]

    with docker_api(pull="silent") as (address, seen):  # docker-py's pull waited for the stream without any limit
        outcome = _within(30, lambda: DockerEngine(address, {}, timeout=2).pull("r.example/a", "sha256:" + "1" * 64,
                                                                                None))
    assert isinstance(outcome, EngineError) and str(outcome) == (
        f"pulling r.example/a@sha256:{'1' * 64} failed: the engine stopped answering: nothing from it in 2 s "
        f"(engine at {address})")
    # a load's stream the engine stops taking: its send waited an hour too
    big, _ = make_release(tmp_path / "big", layers=[bytes(8 << 20)] * 3)
    with docker_api() as (address, seen):
        result = _within(30, lambda: cli("--json", "deploy", str(big), "--engine", address, "--engine-timeout", "2"))
    row = json.loads(result.out)["engines"][0]
    assert row["detail"] == ("loading the image failed: the engine stopped taking what was sent: nothing of it taken "
                             f"in 2 s (--engine-timeout) (engine at {address})"), row["detail"]
    assert result.code == 3 and seen == ["load held"]
    result = cli("deploy", str(folder), "--engine", "tcp://127.0.0.1:1", "--engine-timeout", "0")
    assert result.code == 2 and "--engine-timeout 0 is out of range 1..86400" in result.error_lines[-1]


def test_an_interrupt_breaks_off_the_pulls_under_way_and_says_what_was_left(tmp_path, fake_api_only):
    """deploy --from registry interrupted waited for the pulls already running to their end (a big
    image: minutes; only a third interrupt ended it, without a word of what was left). A pull under way
    is now broken off at once (its connection shut: the engine ends the pull), and the interrupt says
    which engine holds the release and which pull was broken off."""
    from unibake.docker_engine import DockerEngine

    folder, image_id = make_release(tmp_path / "release")
    m = load_manifest(folder)
    engines, connect = fleet("a")
    deploy(Plan(folder=folder, manifest=m, source="archive"), ["tcp://a:2375"], connect)

    def pull(engine, stop, advance):
        engine.pull("r.example/a", "sha256:" + "1" * 64, None, stop)
        return image_id

    with docker_api() as (address, seen):
        def connect_both(where):
            return engines[where] if where in engines else DockerEngine(where, {}, timeout=60)

        def ctrl_c(result):
            while "pull began" not in seen:
                time.sleep(0.05)
            raise KeyboardInterrupt
        start = time.monotonic()
        outcome = _within(20, lambda: deploy(Plan(folder=folder, manifest=m, source="registry", pull=pull),
                                             ["tcp://a:2375", address], connect_both, on_result=ctrl_c))
        took = time.monotonic() - start
        deadline = time.monotonic() + 5
        while "pull broken off" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
    assert isinstance(outcome, KeyboardInterrupt), outcome
    assert took < 15, took  # (the pull never ends: any bound short of _within's shows it broken off; 5 s flaked)
    assert str(outcome) == f"tcp://a:2375 holds the release (checked); {address} does not (its pull was broken off)"
    assert seen == ["pull began", "pull broken off"]  # the engine saw its client go: it ends the pull


def test_breaking_off_a_pull_over_ssh_ends_its_ssh_client_without_a_thread_s_traceback(monkeypatch):
    """docker-py's ssh:// socket is no connected socket (it is ssh's pipes): breaking a pull off closes it,
    which ends ssh; a pipe already broken raised BrokenPipeError in the breaker's thread (a traceback on
    stderr, 'Exception in thread')."""
    from types import SimpleNamespace

    from unibake.docker_engine import _Breaker

    class SSHLike(socket.socket):  # as docker-py's SSHSocket: a socket never connected, closed through its pipes
        closed_at = []

        def close(self):
            self.closed_at.append(time.monotonic())
            raise BrokenPipeError(32, "Broken pipe")

    crashed = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    stop = threading.Event()
    with SSHLike() as sock:
        response = SimpleNamespace(raw=SimpleNamespace(_connection=SimpleNamespace(sock=sock)))
        with _Breaker(stop, response):
            stop.set()
            deadline = time.monotonic() + 5
            while not SSHLike.closed_at and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)
        socket.socket.close(sock)
    assert SSHLike.closed_at and crashed == []


@contextmanager
def loading_engine(*, storing, last=b'{"stream":"Loaded image: demo-llm:1.3.1\\n"}\r\n',
                   event=b'{"status":"Loading layer","progressDetail":{"current":1,"total":2},"id":"0123"}\r\n',
                   every=0.2):
    """A Docker Engine 20.10's image load on loopback: it reads the whole archive sent, then stores its
    layers for ``storing`` seconds; asked for its progress (quiet=0, as the docker CLI asks) it says how
    far it is every 0.2 s meanwhile, otherwise (no quiet given: the engine's default is quiet) nothing
    until the end (``event``, every ``every`` s, is what it says). Yields (address, the quiet values asked for)."""
    import urllib.parse

    asked = []

    class Engine(EngineAPI):

        def do_GET(self):  # noqa: N802 - http.server's names
            _version_reply(self)

        def do_POST(self):  # noqa: N802
            while True:  # the archive, sent chunked
                size = int(self.rfile.readline().split(b";")[0], 16)
                self.rfile.read(size + 2)
                if size == 0:
                    break
            quiet = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("quiet", ["1"])[0]
            asked.append(quiet)
            progress = quiet in ("0", "false", "False")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            if progress:  # the engine's writer sends its headers with its first word
                self.end_headers()
            start = time.monotonic()
            try:
                while time.monotonic() - start < storing:
                    if progress:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                        self.wfile.flush()
                    time.sleep(every)
                if not progress:
                    self.end_headers()
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
                self.wfile.flush()
            except OSError:  # the client went away
                pass

    with _serving(Engine) as address:
        yield address, asked


def test_a_load_whose_engine_stores_layers_for_longer_than_the_engine_timeout_is_not_cut_off(fake_api_only):
    """Engine 20.10 loads quietly unless asked otherwise: it said nothing while it stored the layers it was
    sent (minutes for an image of tens of GB), so --engine-timeout (600 s) failed a working engine's load.
    The load asks for the engine's progress, as the docker CLI does: only an engine that stops is cut off."""
    from unibake.docker_engine import DockerEngine

    with loading_engine(storing=3) as (address, asked):
        outcome = _within(30, lambda: DockerEngine(address, {}, timeout=1).load(iter([b"x" * 1000, b"y" * 10])))
    assert not isinstance(outcome, BaseException), outcome
    assert outcome.tags == ("demo-llm:1.3.1",) and asked == ["False"]  # (the engine lower-cases it)


def test_a_load_whose_engine_talks_without_end_is_held_in_bounded_memory(fake_api_only):
    """Found by probing: the load kept every message of its answer; an engine that sent 60 kB events without end
    filled the client's memory (7 GB in 15 s), --engine-timeout never reached as the engine kept talking. The
    last messages alone are kept; an event without end is refused past 1 MiB."""
    from unibake.docker_engine import LOAD_MESSAGES, DockerEngine
    from unibake.errors import EngineError

    chatty = b'{"stream": "%s"}\r\n' % (b"x" * 60000)
    with loading_engine(storing=2, event=chatty, every=0.002) as (address, _):
        outcome = _within(30, lambda: DockerEngine(address, {}, timeout=5).load(iter([b"x" * 1000])))
    assert not isinstance(outcome, BaseException), outcome
    assert outcome.tags == ("demo-llm:1.3.1",) and len(outcome.messages) == LOAD_MESSAGES
    endless = b'{"stream": "' + b"y" * (2 << 20)  # one event, never closed
    with loading_engine(storing=0, last=endless) as (address, _):
        outcome = _within(30, lambda: DockerEngine(address, {}, timeout=5).load(iter([b"x" * 1000])))
    assert isinstance(outcome, EngineError) and "an event longer than 1 MiB" in str(outcome), outcome


def test_an_interrupt_breaks_off_a_load_while_the_engine_stores_what_it_was_sent(fake_api_only):
    """Found by probing: the interrupt was seen only as the archive was sent; once the engine had it all, the
    deploy waited out the engine's storing (two interrupts did nothing, the third ended it with no word of the
    engines). The answer's connection is now shut at once."""
    from unibake.docker_engine import DockerEngine
    from unibake.errors import HandoffAborted

    stop = threading.Event()
    with loading_engine(storing=60) as (address, _):
        threading.Timer(1.0, stop.set).start()
        began = time.monotonic()
        outcome = _within(20, lambda: DockerEngine(address, {}, timeout=30).load(iter([b"x" * 1000]), stop=stop))
    assert isinstance(outcome, HandoffAborted) and time.monotonic() - began < 10, outcome


@pytest.mark.parametrize("last", [b"not json at all\r\n", b"[1, 2]\r\n", b'"text"\r\n', b"7\r\n",
                                  b'{"errorDetail": null, "error": "no space left"}\r\n', b'{"stream": 7}\r\n',
                                  b'{"errorDetail": "x"}\r\n', b"not json, no newline"])
def test_a_load_answered_with_something_that_is_not_its_progress_is_one_engine_error(fake_api_only, last):
    """An engine (or what answers in its place) whose load answer is no JSON object, or whose error has no
    detail, was a traceback from the parse (ValueError, AttributeError, docker-py's StreamParseError) in
    every caller but deploy; it is one error naming the engine."""
    from unibake.docker_engine import DockerEngine
    from unibake.errors import EngineError

    with loading_engine(storing=0, last=last) as (address, _):
        outcome = _within(30, lambda: DockerEngine(address, {}, timeout=5).load(iter([b"x" * 1000])))
    if last == b'{"stream": 7}\r\n':  # a stream that is no text: not a message, nothing loaded named
        assert not isinstance(outcome, BaseException) and outcome.tags == (), outcome
        return
    assert isinstance(outcome, EngineError), outcome
    assert address in str(outcome)
    if b"no space left" in last:
        assert "refused the image: no space left" in str(outcome)
    elif b"errorDetail" in last:
        assert "refused the image" in str(outcome)
    else:
        assert "not its progress" in str(outcome)


def test_an_interrupt_breaks_off_a_pull_whose_engine_has_not_answered_yet(tmp_path, fake_api_only):
    """An engine sends nothing, not even its answer's headers, until it has reached the registry (its
    ping, its login, the manifest: up to a minute for a slow or unreachable one). An interrupt then was
    waited out until the engine's first word (or --engine-timeout): the pull was broken off only once it
    had answered. It is now broken off at once."""
    from unibake.docker_engine import DockerEngine
    from unibake.errors import HandoffAborted

    stop = threading.Event()
    with docker_api(pull="late") as (address, seen):
        engine = DockerEngine(address, {}, timeout=60)

        def interrupt():
            while "pull held" not in seen:
                time.sleep(0.05)
            stop.set()
        threading.Thread(target=interrupt, daemon=True).start()
        start = time.monotonic()
        outcome = _within(20, lambda: engine.pull("r.example/a", "sha256:" + "1" * 64, None, stop))
        took = time.monotonic() - start
    assert isinstance(outcome, HandoffAborted), outcome
    assert took < 15, took  # (the engine says nothing for 60 s, its timeout: 5 s flaked on a loaded machine)


def test_a_pull_without_credentials_sends_the_engine_none_of_this_user_s_docker_config(tmp_path, monkeypatch,
                                                                                       fake_api_only):
    """deploy and pull give the engine the credentials they resolved (--auth-file, else the Docker
    config), or none; with none, docker-py's pull sent the engine whatever this process's own Docker
    config held for that registry (with --auth-file, credentials the user never gave; its credential
    helper run with every secret of the environment), to every engine of the fleet."""
    import base64

    from unibake.docker_engine import DockerEngine

    config = tmp_path / "docker"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"auths": {"r.example": {
        "auth": base64.b64encode(b"ambient:push-secret").decode()}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    with docker_api(pull="silent") as (address, seen):
        outcome = _within(30, lambda: DockerEngine(address, {}, timeout=1).pull("r.example/a", "sha256:" + "1" * 64,
                                                                                None))
    assert isinstance(outcome, EngineError), outcome
    assert seen == ["pull began"]


def test_a_pull_that_trickles_past_its_pull_deadline_is_broken_off_and_its_row_fails(tmp_path, fake_api_only):
    """``pull`` and ``deploy --from registry`` had no overall deadline: an engine whose registry trickles
    (a progress event now and then, never a silence as long as --engine-timeout) held the command for as
    long as the pull took. ``--pull-deadline`` breaks it off (the engine ends it), tags nothing, and
    says so: pull's error, deploy's row (the other engines go on)."""
    from unibake.docker_engine import DockerEngine
    from unibake.registry import OCI_MANIFEST, ManifestInfo, Reference, pull_into

    folder, image_id = make_release(tmp_path / "release")
    m = load_manifest(folder)
    engines, connect = fleet("a")
    deploy(Plan(folder=folder, manifest=m, source="archive"), ["tcp://a:2375"], connect)
    ref = Reference(host="r.example", path="a", digest="sha256:" + "1" * 64)
    info = ManifestInfo(media_type=OCI_MANIFEST, config_digest=m.image_id, compressions=frozenset({"gzip"}))

    with docker_api() as (address, seen):  # a pull whose progress never stops (an event every 0.1 s)
        engine = DockerEngine(address, {}, timeout=60)
        start = time.monotonic()
        outcome = _within(20, lambda: pull_into(engine, ref, m, info, None, deadline=1))
        took = time.monotonic() - start
        assert isinstance(outcome, EngineError), outcome
        assert str(outcome) == (f"the engine at {address} did not finish pulling r.example/a@{ref.digest} in 1 s "
                                "(--pull-deadline): the pull was broken off (the engine ends it) and nothing was "
                                "tagged; give a longer --pull-deadline, or check the engine's way to the registry")
        assert 1 <= took < 15, took  # (the pull never ends: 5 s flaked on a loaded machine)

        def connect_both(where):
            return engines[where] if where in engines else DockerEngine(where, {}, timeout=60)

        plan = Plan(folder=folder, manifest=m, source="registry",
                    pull=lambda engine, stop, advance: pull_into(engine, ref, m, info, None, stop=stop, deadline=1))
        results = _within(20, lambda: deploy(plan, ["tcp://a:2375", address], connect_both))
        deadline = time.monotonic() + 5
        while seen.count("pull broken off") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [r.result for r in results] == ["skipped", "failed"]
    assert "did not finish pulling" in results[1].detail and "in 1 s (--pull-deadline)" in results[1].detail
    assert sorted(seen) == ["pull began"] * 2 + ["pull broken off"] * 2  # the engine saw its client go: it ends it


FAKE_SSH = """#!{python}
# ssh as docker-py runs it ('ssh -l USER -- HOST docker system dial-stdio'): its pipes joined to a fake
# engine's API on loopback
import os, socket, sys, threading
sock = socket.create_connection(("127.0.0.1", int(os.environ["UNIBAKE_FAKE_ENGINE_PORT"])))
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        sock.sendall(data)
threading.Thread(target=up, daemon=True).start()
while True:
    data = sock.recv(65536)
    if not data:
        break
    os.write(1, data)
"""


@pytest.mark.parametrize("silent", ["inspect", "load"])
def test_an_ssh_engine_that_stops_answering_fails_its_row_after_engine_timeout(tmp_path, monkeypatch, silent):
    """Over ssh:// docker-py reads the ssh client's pipes, which have no timeout: deploy --engine-timeout
    did not apply, and an engine that took a request and said nothing held its row (and deploy) without
    end. Each read and write is now held to the timeout: past it ssh is ended, and the row says so."""
    folder, _ = make_release(tmp_path / "release")
    m = load_manifest(folder)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ssh").write_text(FAKE_SSH.format(python=sys.executable))
    (tmp_path / "bin" / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")

    def checked(self, *args, base_url=None, **kwargs):
        assert base_url == "ssh://unibake@fake-node", base_url
        REAL_API_CLIENT(self, *args, base_url=base_url, **kwargs)
    monkeypatch.setattr(docker.APIClient, "__init__", checked)
    from unibake.docker_engine import DockerEngine

    with docker_api(inspect="silent" if silent == "inspect" else "404") as (address, seen):
        monkeypatch.setenv("UNIBAKE_FAKE_ENGINE_PORT", address.rsplit(":", 1)[1])
        start = time.monotonic()
        results = _within(30, lambda: deploy(
            Plan(folder=folder, manifest=m, source="archive"), ["ssh://unibake@fake-node"],
            lambda where: DockerEngine(where, {}, timeout=2, timeout_option="--engine-timeout")))
        took = time.monotonic() - start
    assert isinstance(results, list), results
    row = results[0]
    assert row.result == "failed", row
    assert "nothing from it in 2 s (--engine-timeout)" in row.detail or \
        "nothing of it taken in 2 s (--engine-timeout)" in row.detail, row.detail
    assert took < 25, took  # (the engine holds the request for 60 s; a fake ssh on a loaded machine is slow)
    assert seen == [f"{silent} held"]


def test_a_release_deployed_to_an_engine_of_another_platform_says_it_runs_there_only_under_emulation(tmp_path):
    # an arm64 release deployed to amd64 nodes was "loaded, image ID checked" like any other: the
    # operator learnt of it from the first container's "exec format error"
    from .test_publish import _selection

    folder, image_id = make_release(tmp_path / "release", "1.3.1-arm64",
                                    _selection({"tp1", "tp2", "tp4"}, "tp4", platform="linux/arm64"))
    m = load_manifest(folder)
    engines, connect = fleet("amd", "arm", "quiet")
    engines["tcp://amd:2375"].engine_platform = "linux/amd64"
    engines["tcp://arm:2375"].engine_platform = "linux/arm64"
    plan = Plan(folder=folder, manifest=m, source="archive")
    addresses = list(engines)
    note = "; the engine is linux/amd64, the image linux/arm64: it runs there only under emulation"
    first = deploy(plan, addresses, connect)
    assert [(r.result, r.detail) for r in first] == [
        ("loaded", f"image ID {image_id[:19]}... checked{note}"), ("loaded", f"image ID {image_id[:19]}... checked"),
        ("loaded", f"image ID {image_id[:19]}... checked")]  # an engine that does not say: nothing claimed
    raise_if_failed(first)  # a note, not a failure: emulation is a choice
    again = deploy(plan, addresses, connect)
    assert [(r.result, r.detail) for r in again] == [("skipped", f"already holds the image{note}"),
                                                    ("skipped", "already holds the image"),
                                                    ("skipped", "already holds the image")]


@pytest.mark.parametrize("event, message", [
    (b"7", "answered the pull of team/a@sha256:[0-9a-f]{64} with something that is not its progress"),
    (b'"text"', "with something that is not its progress"),
    (b'{"errorDetail": "x", "error": "denied"}', "could not pull team/a@sha256:[0-9a-f]{64}: denied "),
    (b'{"errorDetail": {"message": 7}}', "could not pull .*: 7 "),
    (b'{"error": ["e"]}', "could not pull .*: \\['e'\\] "),
    (b'{"errorDetail": null, "error": null}', "could not pull .*: no reason given "),
])
def test_a_pull_answered_with_something_that_is_not_its_progress_is_one_engine_error(fake_api_only, event, message):
    """An engine (or what answers in its place) whose pull answer is a JSON number, or whose error's
    errorDetail is no object or whose message is no text: a traceback (TypeError, AttributeError) out of
    pull and deploy's row; it is one error naming the engine, as a load's is."""

    from unibake.docker_engine import DockerEngine
    from unibake.errors import EngineError

    class Engine(EngineAPI):

        def do_GET(self):  # noqa: N802 - http.server's names
            _version_reply(self)

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            line = event + b"\r\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(line), line))
            self.wfile.flush()

    digest = "sha256:" + "ab" * 32
    with _serving(Engine) as address:
        outcome = _within(30, lambda: DockerEngine(address, {}, timeout=5).pull("team/a", digest, None))
    assert isinstance(outcome, EngineError), repr(outcome)
    assert re.search(message, str(outcome)) and str(outcome).endswith(f"(engine at {address})"), str(outcome)


@pytest.mark.parametrize("status, opening", [(200, b'{"status": "'), (500, b'{"message": "'), (200, b"[" * 4096)])
def test_a_pull_answered_without_end_is_held_in_bounded_memory_and_is_one_engine_error(fake_api_only, status,
                                                                                        opening):
    """Found by review: the pull's events were docker-py's decoder's, which keeps all it read until it parses (an
    event never closed grew without bound, each piece parsing the whole again: quadratic), and an error status's
    body was read whole to build the error; neither ever timed out, as the engine kept talking. Each is cut off
    at 1 MiB, as a load's answer is."""
    from unibake.docker_engine import DockerEngine
    from unibake.errors import EngineError

    class Engine(EngineAPI):

        def do_GET(self):  # noqa: N802 - http.server's names
            _version_reply(self)

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                piece = opening + b"x" * (1 << 16)
                while True:  # never ends: the client must stop reading
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    piece = (b"[" if opening.startswith(b"[") else b"x") * (1 << 16)
            except OSError:  # the client went away
                pass

    digest = "sha256:" + "ab" * 32
    with _serving(Engine) as address:
        outcome = _within(30, lambda: DockerEngine(address, {}, timeout=5).pull("team/a", digest, None))
    assert isinstance(outcome, EngineError), repr(outcome)
    assert ("longer than 1 MiB" in str(outcome)) and str(outcome).endswith(f"(engine at {address})"), str(outcome)
    assert len(str(outcome)) < 500

@pytest.mark.parametrize("what", ["load", "pull"])
def test_an_ssh_engine_slow_but_live_is_not_cut_off_by_its_timeout(tmp_path, monkeypatch, what):
    """Over ssh:// each read is held to the timeout, not the whole answer: a load whose engine stores
    layers for 3 s saying how far it is every 0.2 s, or a pull whose engine says something every 0.1 s,
    goes on past a 1 s timeout (as over TCP)."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ssh").write_text(FAKE_SSH.format(python=sys.executable))
    (tmp_path / "bin" / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(docker.APIClient, "__init__", REAL_API_CLIENT)
    from unibake.docker_engine import DockerEngine
    from unibake.errors import HandoffAborted

    if what == "load":
        with loading_engine(storing=3) as (address, _):
            monkeypatch.setenv("UNIBAKE_FAKE_ENGINE_PORT", address.rsplit(":", 1)[1])
            outcome = _within(30, lambda: DockerEngine("ssh://unibake@fake-node", {}, timeout=1).load(
                iter([b"x" * 1000, b"y" * 10])))
        assert not isinstance(outcome, BaseException), outcome
        assert outcome.tags == ("demo-llm:1.3.1",)
        return
    stop = threading.Event()
    threading.Timer(3, stop.set).start()
    with docker_api(pull="progress") as (address, seen):
        monkeypatch.setenv("UNIBAKE_FAKE_ENGINE_PORT", address.rsplit(":", 1)[1])
        outcome = _within(30, lambda: DockerEngine("ssh://unibake@fake-node", {}, timeout=1).pull(
            "team/a", "sha256:" + "ab" * 32, None, stop))
    assert isinstance(outcome, HandoffAborted), repr(outcome)  # (broken off by the interrupt, not timed out)


def test_an_engine_error_on_a_named_container_or_network_names_it_whole(fake_api_only):
    """A multi-node gate's ranks are removed by name: cut to 12 characters ("unibake-smok") the error
    named no container the adopter could find and remove; an ID is still shown by its first 12."""

    from unibake.docker_engine import DockerEngine
    from unibake.errors import EngineError

    class Engine(EngineAPI):

        def reply(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.endswith("/version"):
                return _version_reply(self)
            _json_reply(self, 500, {"message": "driver failed"})

        do_GET = do_POST = do_DELETE = reply  # noqa: N815 - http.server's names

    name = "unibake-smoke-0123456789ab-rank3"
    with _serving(Engine) as address:
        engine = DockerEngine(address, {}, timeout=10)
        for what, call in (("cannot remove container", engine.remove_container),
                           ("cannot inspect container", engine.container_status),
                           ("cannot inspect container", engine.container_state),
                           ("cannot remove network", engine.remove_network)):
            with pytest.raises(EngineError, match=f"^{what} {name}: .*driver failed"):
                call(name)
        with pytest.raises(EngineError, match="^cannot remove container abcdef012345: "):
            engine.remove_container("abcdef012345" * 5 + "abcd")


def test_a_docker_context_docker_would_use_is_refused_not_passed_over_for_the_local_socket(cli, tmp_path):
    # with DOCKER_CONTEXT=gpu1, or `docker context use gpu1`, docker reaches gpu1's engine; unibake reads no
    # contexts and went to the local socket without a word: prune removed, pull pulled and verify --load loaded on
    # another engine than the one the adopter's docker showed, and deploy asked for DOCKER_HOST only
    from unibake.docker_engine import DockerEngine, docker_context

    folder, _ = make_release(tmp_path / "release")
    config = tmp_path / "docker-config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"auths": {}, "currentContext": "gpu1"}))
    kit = tmp_path / "demo-llm-1.3.1-kit"
    kit.mkdir()
    (kit / "kit.json").write_text("{}")
    for env, says in (({"DOCKER_CONTEXT": "gpu1"}, "DOCKER_CONTEXT=gpu1"),
                      ({"DOCKER_CONFIG": str(config)}, f"the docker context 'gpu1' ({config / 'config.json'}'s "
                                                       "currentContext, set by docker context use)")):
        # (and before any other work: build, hotfix, repro and archive planned, rendered and read the earlier release
        # first, rebuild hashed the whole kit)
        for args in (["prune", "--dry-run", "--out", str(tmp_path / "release")],
                     ["pull", "r.example/a@sha256:" + "0" * 64, "--release", str(folder)],
                     ["verify", str(folder), "--load"], ["build", "--config", str(tmp_path / "none")],
                     ["build", "--stage", "build", "--config", str(tmp_path / "none")],
                     ["hotfix", "--from", str(folder), "--version", "1.3.2", "--config", str(tmp_path / "none")],
                     ["repro", "--config", str(tmp_path / "none")], ["archive", "localhost/x:1"],
                     ["rebuild", str(kit)]):
            result = cli(*args, env={"CI": "true", **env})
            assert result.code == 2 and result.error_lines == [
                f"error: {says}: unibake reads no docker contexts, so it would reach unix:///var/run/docker.sock, not "
                "the engine docker reaches; give --engine URL or DOCKER_HOST (docker context inspect shows the "
                "context's address)"], result.err
        result = cli("deploy", str(folder), env={"CI": "true", **env})
        assert result.code == 2 and result.error_lines == [
            "error: deploy needs at least one engine: --engine URL (repeat it), --hosts FILE or DOCKER_HOST; "
            f"{says} is docker's, and unibake reads no docker contexts (docker context inspect shows its address)"]
    # the default context is the local socket, as here; DOCKER_HOST and --engine name the engine themselves
    (config / "config.json").write_text(json.dumps({"currentContext": "default"}))
    for env in ({"DOCKER_CONTEXT": "default"}, {"DOCKER_CONFIG": str(config)}, {"HOME": str(tmp_path)}, {}):
        assert docker_context(env) is None
    for address, env in ((None, {"DOCKER_CONTEXT": "gpu1", "DOCKER_HOST": "unix:///nonexistent/e.sock"}),
                         ("unix:///nonexistent/e.sock", {"DOCKER_CONTEXT": "gpu1"})):
        with pytest.raises(AssertionError, match="a unit test tried to reach a container engine"):
            DockerEngine(address, env)


def test_a_pull_tells_its_progress_the_bytes_each_layer_downloads(fake_api_only):
    # `pull` of a release of many gigabytes said "==> pull" and then nothing until the engine had it all: the
    # engine's events carry each layer's progress, which were read and dropped

    from unibake.docker_engine import DockerEngine

    events = [{"status": "Pulling fs layer", "id": "aaa"},
              {"status": "Downloading", "progressDetail": {"current": 100, "total": 300}, "id": "aaa"},
              {"status": "Downloading", "progressDetail": {"current": 250, "total": 300}, "id": "aaa"},
              {"status": "Downloading", "progressDetail": {"current": 50, "total": 80}, "id": "bbb"},
              {"status": "Download complete", "id": "aaa"},
              {"status": "Extracting", "progressDetail": {"current": 900, "total": 2000}, "id": "aaa"},
              {"status": "Download complete", "id": "bbb"},
              {"status": "Downloading", "progressDetail": {"current": "x"}, "id": "ccc"},  # (junk: not counted)
              {"status": "Already exists", "id": "ddd"}, {"status": "Pull complete", "id": "aaa"}]

    class Engine(EngineAPI):

        def do_GET(self):  # noqa: N802 - http.server's names
            body = json.dumps({"ApiVersion": "1.41", "Version": "20.10.24", "MinAPIVersion": "1.12"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802 - each event a chunk of its own, as the engine streams them
            _events_reply(self, events)

    with _serving(Engine) as address:
        told = []
        DockerEngine(address, {}).pull("r.example/a", "sha256:" + "1" * 64, None, progress=told.append)
    assert told == [100, 150, 50, 50, 30]  # each layer's bytes as they came, its rest once it was complete
    from unibake.registry import manifest_config_digest

    body = json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "2" * 64, "size": 9},
                       "layers": [{"digest": "sha256:" + "3" * 64, "size": 300}, {"digest": "sha256:" + "4" * 64,
                                                                                 "size": 80},
                                  {"digest": "sha256:" + "5" * 64, "size": True}]}).encode()
    assert manifest_config_digest(body, "r.example/a").layer_bytes == 380  # the total `pull` shows it against


def test_an_engine_named_by_tcp_address_takes_the_tls_settings_docker_takes(monkeypatch, tmp_path):
    # `docker -H tcp://node1:2376 version` uses DOCKER_TLS_VERIFY and DOCKER_CERT_PATH; deploy --engine/--hosts
    # reached only DOCKER_HOST with them, so a fleet of engines behind TLS (2376) could not be deployed to at all
    import docker.errors
    import docker.tls

    from unibake.docker_engine import DockerEngine
    from unibake.errors import EngineError

    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("")
    given = []

    def client(self, *args, **kwargs):
        given.append(kwargs)
        raise docker.errors.DockerException("(the test's stand-in: no engine is reached)")
    monkeypatch.setattr(docker.APIClient, "__init__", client)
    tls_env = {"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(tmp_path)}
    for address, env in (("tcp://node1.example:2376", tls_env), ("ssh://ops@node1.example", tls_env),
                         ("tcp://node1.example:2375", {}), ("unix:///nonexistent/e.sock", tls_env)):
        with pytest.raises(EngineError, match=f"cannot reach the Docker engine at {re.escape(address)}"):
            DockerEngine(address, env)
    tls = given[0].get("tls")
    assert isinstance(tls, docker.tls.TLSConfig) and tls.verify is True and tls.ca_cert == str(tmp_path / "ca.pem")
    assert tls.cert == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert [("tls" in kwargs) for kwargs in given[1:]] == [False, False, False]  # ssh, plain tcp, a socket: as docker
    # DOCKER_CERT_PATH without DOCKER_TLS_VERIFY (or with it empty): docker uses no TLS; docker-py turned TLS on
    # without verifying the engine, and a pull handed the registry's credentials over that connection
    given.clear()
    for env in ({"DOCKER_CERT_PATH": str(tmp_path)}, {"DOCKER_TLS_VERIFY": "", "DOCKER_CERT_PATH": str(tmp_path)}):
        for address in ("tcp://node1.example:2376", None):
            with pytest.raises(EngineError, match="cannot reach the Docker engine at tcp://node1.example:2376"):
                DockerEngine(address, {**env, "DOCKER_HOST": "tcp://node1.example:2376"})
    assert len(given) == 4 and not any(kwargs.get("tls") for kwargs in given)
    given.clear()
    with pytest.raises(EngineError):  # DOCKER_HOST's engine with DOCKER_TLS_VERIFY: verified, as --engine's
        DockerEngine(None, {**tls_env, "DOCKER_HOST": "tcp://node1.example:2376"})
    assert given[0]["tls"].verify is True and given[0]["base_url"] == "tcp://node1.example:2376"


def test_each_engine_s_load_is_counted_as_it_goes_under_its_own_name(tmp_path):
    # deploy --from archive said nothing between "==> deploy" and each engine's row: a 30 GiB load into a
    # dozen engines was minutes of silence. Each engine's load now has its own counter (a line every few
    # seconds, which several engines' threads can print at once), told the bytes as the engine takes them
    folder, image_id = make_release(tmp_path / "release")
    m = load_manifest(folder)
    engines, connect = fleet("a", "b")
    counted, lock = {}, threading.Lock()

    def counter(what, total):
        counted[what] = [total, 0]

        def advance(n):
            with lock:
                counted[what][1] += n
        return advance

    results = deploy(Plan(folder=folder, manifest=m, source="archive", counter=counter), list(engines), connect, jobs=2)
    assert [r.result for r in results] == ["loaded", "loaded"]
    whole = m.archive.uncompressed_bytes
    assert counted == {"tcp://a:2375: load": [whole, whole], "tcp://b:2375: load": [whole, whole]}
    counted.clear()
    assert [r.result for r in deploy(Plan(folder=folder, manifest=m, source="archive", counter=counter),
                                     list(engines), connect)] == ["skipped", "skipped"]
    assert counted == {}  # (an engine that holds the image loads nothing)


def test_a_pull_counts_a_layer_the_engine_holds_already_so_its_total_is_reached(fake_api_only):
    # pull and deploy --from registry show the pull against the manifest's layer bytes; a layer the engine held
    # already ("Already exists": no bytes said) was never counted, so a hotfix's pull, most of whose layers an
    # engine holds, ended at "0.20 GiB of 30.00 GiB, about 900 s left". Its size is now counted when the engine
    # says so, from the manifest

    from unibake.docker_engine import DockerEngine
    from unibake.registry import manifest_config_digest

    held, new = "sha256:" + "a1" * 32, "sha256:" + "b2" * 32
    body = json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "2" * 64, "size": 9},
                       "layers": [{"digest": held, "size": 5000}, {"digest": new, "size": 300}]}).encode()
    info = manifest_config_digest(body, "r.example/a")
    events = [{"status": "Already exists", "id": held[7:19]}, {"status": "Pulling fs layer", "id": new[7:19]},
              {"status": "Downloading", "progressDetail": {"current": 100, "total": 300}, "id": new[7:19]},
              {"status": "Download complete", "id": new[7:19]}, {"status": "Pull complete", "id": new[7:19]}]

    class Engine(EngineAPI):

        def do_GET(self):  # noqa: N802 - http.server's names
            _version_reply(self)

        def do_POST(self):  # noqa: N802
            _events_reply(self, events)

    with _serving(Engine) as address:
        told = []
        DockerEngine(address, {}).pull("r.example/a", "sha256:" + "1" * 64, None, progress=told.append,
                                       sizes=dict(zip(info.layers, info.layer_sizes)))
    assert told == [5000, 100, 200] and sum(told) == info.layer_bytes == 5300


def test_an_ssh_engine_is_reached_without_importing_paramiko(tmp_path):
    """docker-py imported paramiko and cryptography (152 modules, about 0.08 s of every command's start) for an
    SSH client of its own that is never made: an ssh:// engine goes through the system's ssh. They are now
    imported on first use only; a fresh interpreter running the CLI's and the pipeline's imports reaches an
    ssh:// engine (here a fake ssh joined to a fake API) without either being loaded."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ssh").write_text(FAKE_SSH.format(python=sys.executable))
    (tmp_path / "bin" / "ssh").chmod(0o755)
    script = ("import sys, unibake.cli, unibake.pipeline\n"
              "from unibake.docker_engine import DockerEngine\n"
              "engine = DockerEngine('ssh://unibake@fake-node', {}, timeout=10)\n"
              "print(engine.api.version()['ApiVersion'])\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('paramiko', 'cryptography')))\n"
              "import docker.transport.sshconn as sshconn\n"
              "print(sshconn.paramiko.SSHClient.__module__)\n")
    with docker_api() as (address, _):
        env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
               "UNIBAKE_FAKE_ENGINE_PORT": address.rsplit(":", 1)[1]}
        env.pop("DOCKER_HOST", None)
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 0, done.stderr
    version, loaded, client = done.stdout.splitlines()
    assert version.startswith("1."), version
    assert loaded == "['paramiko']", loaded  # the stand-in alone, until a name of paramiko's is used
    assert client == "paramiko.client"  # and then paramiko itself, as before


def test_the_credentials_of_netrc_go_to_no_tcp_engine(tmp_path, monkeypatch, fake_api_only):
    # found by probing: docker-py's client is a requests session, which added ~/.netrc's login (a `default`
    # entry's for any host) to every request to a tcp:// engine, its first (the version) included; the docker
    # CLI sends none

    from unibake.docker_engine import DockerEngine

    netrc = tmp_path / "netrc"
    netrc.write_text("default login netrcuser password netrc-secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    seen = []

    class Engine(EngineAPI):

        def do_GET(self):  # noqa: N802 - http.server's names
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path.endswith("/version"):
                return _version_reply(self)
            _json_reply(self, 404, {"message": "No such image"})

    with _serving(Engine) as address:
        engine = DockerEngine(address, {})
        assert engine.version() == "20.10.24"
        assert engine.inspect_image("unibake-test:0.1.0") is None
    assert len(seen) >= 3 and [auth for _, auth in seen] == [None] * len(seen), seen


def test_the_interrupt_s_note_says_which_engines_may_still_add_the_image_and_which_were_let_go():
    from unibake.deploy import NodeResult, interrupted_note

    results = [NodeResult(engine="a", result="loaded", seconds=1.0),
               NodeResult(engine="b", result="stopped", seconds=1.0,
                          detail="the interrupt broke its load off once the engine had the whole archive: it may "
                                 "still add the image (unchecked; docker image inspect demo-llm:1.3.1)"),
               None, None]
    assert interrupted_note(["a", "b", "c", "d"], results, begun={0, 1, 2}) == (
        "a holds the release (checked); b, c, d do not (b: its load was broken off once the engine had the whole "
        "archive: it may still add the image; c: still under way, let go; d: not begun)")


def test_a_hosts_list_given_as_a_pipe_is_named_as_one_with_what_to_do(cli, tmp_path):
    # found by probing: `--hosts <(...)` said "/proc/PID/fd/pipe:[N]: missing" (the path resolved through the link)
    folder, _ = make_release(tmp_path / "release")
    ran = subprocess.run(["bash", "-c", f"{sys.executable} {REPO / 'build.py'} deploy {folder} --hosts "
                                        "<(echo unix:///tmp/x.sock)"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2, ran.stderr
    assert re.fullmatch(r"error: /dev/fd/\d+: a pipe \(like <\(\.\.\.\) or /dev/stdin\), not a file: save the list "
                        r"of engines to a file and give that \(--hosts FILE\)", ran.stderr.splitlines()[-1]), ran.stderr
