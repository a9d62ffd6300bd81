"""run.sh, the script a release ships to start a profile, under hostile arguments and real multi-GPU/AMD stacks:
each run under dash (CI's /bin/sh) and, where installed, bash and bash --posix."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from .test_publish import METADATA, make_release

SHELLS = [s for s in (["dash"], ["bash"], ["bash", "--posix"], ["busybox", "sh"]) if shutil.which(s[0])]


@pytest.fixture
def folder(tmp_path):
    metadata = json.loads(json.dumps(METADATA))
    metadata["profiles"]["tp4"].update(vendor="amd", devices={"extra": [], "groups": ["render"]})
    folder, _ = make_release(tmp_path / "release", metadata=metadata)
    return folder


def run_sh(shell, folder, *args, env=None):
    return subprocess.run([*shell, str(folder / "run.sh"), *args], capture_output=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_an_error_line_shows_control_characters_of_what_it_quotes_as_escapes_one_line(folder, tmp_path, shell):
    # `--env-file $'x\e[2J'`, a mistyped -e or a GPUS holding a newline was printed raw: the terminal ran the escape
    # sequence, and a newline made a second line that could pass for another message
    cases = [
        ((["--env-file", "e\x1b[2J\x9b\n\terror: forged"], {}),
         b"error: --env-file e\\x1b[2J\\x9b\\n\\terror: forged: no such readable file\n"),
        ((["-e", "A\x07\r=1"], {}), b"error: -e needs NAME=VALUE with NAME like HF_HOME; got 'A\\x07\\r'\n"),
        ((["tp2"], {"GPUS": "0\n1"}), b"error: GPUS must be GPU numbers like 0,1, UUIDs, or all; got '0\\n1'\n"),
        ((["tp1"], {"IMAGE": "demo\x1b]0;x\x07:1"}),
         b"error: IMAGE must be an image reference like demo-llm:1.3.1; got 'demo\\x1b]0;x\\x07:1'\n"),
        # UTF-8 stays as it is; C1 controls (U+0080-U+009F) and bytes that are no UTF-8 are escaped
        ((["--name", "caf\u00e9\u0085", "tp1"], {}),
         "error: the container name must be letters, digits, '_', '.' and '-'; got 'caf\u00e9\\x85'\n".encode()),
        ((["--name", b"caf\xe9".decode("utf-8", "surrogateescape"), "tp1"], {}),
         b"error: the container name must be letters, digits, '_', '.' and '-'; got 'caf\\xe9'\n"),
    ]
    for (args, env), stderr in cases:
        run = run_sh(shell, folder, "--dry-run", *args, env=env)
        assert (run.returncode, run.stdout, run.stderr) == (2, b"", stderr), (args, env)
