"""Differential tests: the same hostile release folder, given to ``build.py verify`` and to
``scripts/verify-release.sh`` (under dash and bash), gets the same verdict. A forger controls every
file of the folder and re-sums SHA256SUMS; what one verifier passes the other must not refuse, and
what one refuses the other must refuse too."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from ..conftest import REPO
from ..forge import resum
from .test_publish import make_release

SCRIPT = REPO / "scripts" / "verify-release.sh"
SHELLS = [s for s in ("dash", "bash") if shutil.which(s)]


@pytest.fixture
def folder(tmp_path):
    return make_release(tmp_path / "release")[0]


def shell(folder, sh: str = "sh") -> subprocess.CompletedProcess:
    return subprocess.run([sh, str(SCRIPT), str(folder), "--no-load"], capture_output=True, text=True, timeout=300)


def verdicts(cli, folder) -> tuple[int, list[int], str, str]:
    """(build.py verify's exit code, the shell verifier's under each shell, their error lines)."""
    python = cli("verify", str(folder))
    assert "Traceback" not in python.err, python.err
    runs = [shell(folder, sh) for sh in SHELLS]
    errors = [line for line in runs[0].stderr.splitlines() if line.startswith("error:")]
    assert len(errors) <= 1, runs[0].stderr
    return python.code, [r.returncode for r in runs], python.err, runs[0].stderr


def assert_same(cli, folder, passes: bool, python_says: str = "", shell_says: str = "") -> None:
    python, shells, python_err, shell_err = verdicts(cli, folder)
    want = 0 if passes else 3
    assert python == want, python_err
    assert shells == [want] * len(SHELLS), shell_err
    assert python_says in python_err, python_err
    assert shell_says in shell_err, shell_err


def edit_manifest(folder, change) -> None:
    path = folder / "manifest.json"
    old = path.read_bytes()
    new = change(old)
    assert new != old
    path.write_bytes(new)
    resum(folder)


NOT_CANONICAL = "not written as unibake writes it"


@pytest.mark.parametrize("change", [
    pytest.param(lambda t: t.replace(b'"platform": "linux/amd64"', b'"platform": "linux\\/amd64"'), id="escaped slash"),
    pytest.param(lambda t: t.replace(b'"image_id": "sha256:', b'"image_id": "sha256\\u003a'), id="escaped digest"),
    pytest.param(lambda t: t.replace(b'"org.opencontainers.image.version": "1.3.1"',
                                     b'"org.opencontainers.image.version": "1.3.\\u0031"'), id="escaped label"),
    pytest.param(lambda t: json.dumps(json.loads(t)).encode() + b"\n", id="one line"),
    pytest.param(lambda t: json.dumps(json.loads(t), indent=4).encode() + b"\n", id="indent 4"),
    pytest.param(lambda t: t.rstrip(b"\n"), id="no final newline"),
    pytest.param(lambda t: t + b"\n", id="blank last line"),
    pytest.param(lambda t: t.replace(b"\n", b"\r\n"), id="crlf"),
    pytest.param(lambda t: t.replace(b'"level": 3', b'"level": 3.0'), id="a float"),
    pytest.param(lambda t: t.replace(b'"level": 3', b'"level": 3e0'), id="an exponent"),
    pytest.param(lambda t: t.replace(b'"level": 3', b'"level": 03'), id="a leading zero"),
    pytest.param(lambda t: t.replace(b'"org.opencontainers.image.version": "1.3.1"',
                                     b'"org.opencontainers.image.version": "1.3.1\\u00E9"'), id="upper-case escape"),
    pytest.param(lambda t: t.replace(b'"org.opencontainers.image.version": "1.3.1"',
                                     b'"org.opencontainers.image.version": "1.3.1\xc3\xa9"'), id="raw utf-8"),
    pytest.param(lambda t: t.replace(b'"org.opencontainers.image.version": "1.3.1"',
                                     b'"org.opencontainers.image.version": "1.3.1\\u000a"'), id="long form of \\n"),
])
def test_a_manifest_not_in_unibakes_one_form_is_refused_by_both_in_one_line(cli, folder, change):
    edit_manifest(folder, change)
    assert_same(cli, folder, passes=False, shell_says=NOT_CANONICAL)
    said = cli("verify", str(folder)).error_lines
    assert len(said) == 1 and any(s in said[0] for s in (NOT_CANONICAL, "not valid JSON", "not a valid release manifest")), said


def test_a_manifest_holding_every_escape_json_dumps_writes_passes_both(cli, folder):
    def labelled(text: bytes) -> bytes:
        manifest = json.loads(text)
        manifest["labels"]["x"] = 'a "quoted" back\\slash \u00e9\U0001f600 \x7f tab\t'
        return json.dumps(manifest, indent=2).encode() + b"\n"

    edit_manifest(folder, labelled)
    assert b"\\u00e9\\ud83d\\ude00 \\u007f tab\\t" in (folder / "manifest.json").read_bytes()
    assert_same(cli, folder, passes=True)

