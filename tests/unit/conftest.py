"""Unit tests never touch an engine: any attempt to reach Docker fails the test at once."""

from __future__ import annotations

import subprocess

import docker
import pytest


@pytest.fixture(autouse=True)
def no_engine(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a unit test tried to reach a container engine; move it to tests/engine")

    monkeypatch.setattr(docker.APIClient, "__init__", refuse)
    real_popen = subprocess.Popen.__init__

    def guarded_popen(self, args, *rest, **kwargs):
        argv0 = str(args[0] if isinstance(args, (list, tuple)) else args).split()[0]
        if argv0.rsplit("/", 1)[-1] in ("docker", "dockerd", "containerd"):
            refuse()
        return real_popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
