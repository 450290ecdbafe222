"""testrig.sweep.port_holders: the evidence behind a "port still held" assertion, from a real socket here."""
from __future__ import annotations

import os
import socket

from testrig.sweep import port_holders


def test_a_listening_socket_is_named_with_its_state_and_its_process():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as cli:
            conn, _ = srv.accept()
            with conn:
                held = port_holders("127.0.0.1", port)
                # the listener and the accepted end are bound to the port; the client's end is not
                assert any(h.startswith(f"LISTEN 127.0.0.1:{port} -> 0.0.0.0:0 ") for h in held), held
                assert any(h.startswith(f"ESTABLISHED 127.0.0.1:{port} -> 127.0.0.1:{cli.getsockname()[1]} ")
                           for h in held), held
                assert all(f"pid {os.getpid()} " in h for h in held), held
                assert len(held) == 2, held
    # closed by us; what is left is the kernel's (TIME_WAIT, no process), or nothing
    assert all(h.endswith(": no process") for h in port_holders("127.0.0.1", port))


def test_another_address_or_port_is_not_listed():
    with socket.socket() as srv:
        srv.bind(("127.0.0.2", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert port_holders("127.0.0.3", port) == []
        assert len(port_holders("127.0.0.2", port)) == 1
