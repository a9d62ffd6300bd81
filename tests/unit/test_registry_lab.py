"""The engine tests' registry (tests/registry_lab.py) without an engine: it says it listens only when it does."""

from __future__ import annotations

import shutil
import socket
import threading

import pytest

from ..registry_lab import Registry


@pytest.mark.skipif(shutil.which("docker-registry") is None or shutil.which("htpasswd") is None,
                    reason="needs Debian's docker-registry and htpasswd")
def test_a_port_another_server_took_meanwhile_is_not_taken_for_the_registry(tmp_path):
    """The registry's port is chosen free, then bound by the registry a moment later: a server another run
    started on it meanwhile (helpers run side by side) was taken for the registry (any connection
    counted), while the registry itself had failed with 'address already in use', and the tests then
    spoke to another server. Only a TLS handshake with the registry's own certificate counts now."""
    reg = Registry(tmp_path)
    other = socket.create_server(("127.0.0.1", reg.port))  # the other run's server, on the port chosen
    taken = []

    def accept():
        try:
            while True:
                taken.append(other.accept()[0])
        except OSError:
            return
    threading.Thread(target=accept, daemon=True).start()
    try:
        with pytest.raises(AssertionError, match="address already in use"):
            reg.start()
    finally:
        reg.stop()
        other.close()
        for conn in taken:
            conn.close()
