"""``pip install .`` gives a working ``unibake`` command: the templates travel as package data, the
version comes from pyproject.toml, and the manifest's published JSON Schema is current."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

from unibake.manifest import json_schema

from ..conftest import BUSYBOX_PRODUCT, REPO


def test_the_wheel_carries_the_templates_and_the_unibake_command(tmp_path):
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ and *.egg-info there
    shutil.copytree(REPO / "unibake", source / "unibake", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("unibake-*.whl"))
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name == f"unibake-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(f"unibake-{version}.dist-info/entry_points.txt").decode()
    assert {f"unibake/templates/{t}" for t in ("Dockerfile.j2", "run.sh.j2", "RELEASE_NOTES.md.j2")} <= names
    assert "unibake = unibake.__main__:run" in entry_points  # (its signals handled as build.py does)

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{sysconfig.get_paths()['purelib']}", "CI": "1"}
    work = tmp_path / "elsewhere"  # no pyproject.toml, no unibake/ folder: only the installed package
    work.mkdir()
    run = subprocess.run([sys.executable, "-m", "unibake", "-V"], capture_output=True, text=True, env=env, cwd=work)
    assert run.stdout == f"unibake {version}\n", run.stderr
    render = subprocess.run([sys.executable, "-m", "unibake", "--json", "--stage", "render", "--config",
                             str(BUSYBOX_PRODUCT / "profiles"), "--version", "9.9"], capture_output=True, text=True,
                            env=env, cwd=work)
    assert render.returncode == 0, render.stderr
    assert json.loads(render.stdout)["image"] == "unibake-test:9.9"


def test_the_published_manifest_schema_is_current():
    published = json.loads((REPO / "docs" / "manifest.schema.json").read_text())
    assert published == json_schema(), "regenerate: python -m unibake.manifest > docs/manifest.schema.json"
