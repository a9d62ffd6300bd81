"""Shared helpers: the repository's paths, a copy of a product to change freely, the CLI in-process."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from unibake.cli import main

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BUSYBOX_PRODUCT = FIXTURES / "busybox-product"


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


@pytest.fixture
def cli(capsys):
    """Run ``python build.py ARGS`` in-process from ``cwd``; returns the exit code and output."""

    def run(*args: str, cwd: Path = REPO, env: dict | None = None) -> CliResult:
        capsys.readouterr()
        code = main(list(args), env=env if env is not None else {"CI": "true"}, cwd=cwd)
        captured = capsys.readouterr()
        return CliResult(code=code, out=captured.out, err=captured.err)

    return run


def copy_product(src: Path, dst: Path) -> Path:
    """A writable copy of a product folder (profiles/, images/); returns its profiles folder."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("dockerfiles", "__pycache__"))
    return dst / "profiles"


@pytest.fixture
def busybox_product(tmp_path) -> Path:
    """A copy of the busybox test product; returns its profiles folder."""
    return copy_product(BUSYBOX_PRODUCT, tmp_path / "product")


@pytest.fixture
def demo_product(tmp_path) -> Path:
    """A copy of the example product (profiles/ and images/); returns its profiles folder."""
    root = tmp_path / "demo"
    root.mkdir()
    shutil.copytree(REPO / "profiles", root / "profiles")
    shutil.copytree(REPO / "images", root / "images", ignore=shutil.ignore_patterns("__pycache__"))
    return root / "profiles"
