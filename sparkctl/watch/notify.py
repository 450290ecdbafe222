"""`--notify URL` / `--notify-file PATH` / `--notify-env VAR`: one JSON POST per restart and per give-up, bounded
and free of secrets.

Bounds: one total deadline (`TIMEOUT_S`) for the whole request, name lookup, connect, TLS handshake, sending and
reading the answer together (every socket operation waits at most what is left of it, so a hook that answers one
byte at a time costs the deadline, not a timeout per byte); a body of at most `MAX_BODY` bytes (longer text fields
are cut); at most `MAX_REPLY` bytes of the answer read; no redirect followed; no proxy or netrc read. The payload is
built from fixed fields (event, cluster, desired state, reason, evidence, counts, time); the values of the secret
variables sparkctl knows (the profile's API key variable, HF_TOKEN ...) are replaced by ``***`` wherever they
appear.

The URL is a secret when it carries credentials (`url_credentials`: a user or password, a query string, a
token-like path segment): such a URL never goes into an argv (`--notify` refuses it, naming `--notify-file` and
`--notify-env`), and it is shown only through `shown_url` (credentials, query and token segments as ``***``). A
webhook that fails is one line on stderr; it never stops the supervisor. Example::

    Notifier("https://hooks.example/sparkctl").send({"event": "restart", ...}, reporter)
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import ssl
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject, JSONValue
from sparkctl.redaction import SECRET_ENV
from sparkctl.untrusted import mask_url_credentials

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

    from sparkctl.deploy.progress import Reporter

TIMEOUT_S = 5.0
MAX_BODY = 16 * 1024
MAX_REPLY = 64 * 1024
FIELD_LIMIT = 2000
MAX_URL_FILE = 8 * 1024
HOW_TO_PASS = ("put the URL in a file only you can read and give --notify-file PATH (chmod 600 PATH), or in a "
               "variable and give --notify-env VAR: an argv is visible to every user of this machine (ps, /proc) "
               "and is written into the systemd unit")
_URL = re.compile(r"\bhttps?://[^\s\"'<>]+", re.IGNORECASE)


_RUN = re.compile(r"[A-Za-z0-9_]{16,}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _token_like(segment: str) -> bool:
    """A path segment that looks like a secret: an unbroken run of 16 letters, digits or underscores mixing letters
    and digits (a Slack or Discord hook's token), or a UUID. A model name (``Qwen3-30B-A3B-Instruct-2507``) is not."""
    s = unquote(segment)
    return bool(_UUID.search(s)) or any(any(c.isdigit() for c in m) and any(c.isalpha() for c in m)
                                        for m in _RUN.findall(s))


def url_credentials(url: str) -> list[str]:
    """What in `url` is a credential: 'a user name or password', 'a query string', 'a token in its path'."""
    parts = urlsplit(url)
    found = []
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        found.append("a user name or password")
    if parts.query:
        found.append("a query string")
    if any(_token_like(seg) for seg in parts.path.split("/")):
        found.append("a token in its path")
    return found


def shown_url(url: str) -> str:
    """The URL as it may appear in any output: credentials masked, the query and fragment hidden, token-like path
    segments as ``***``."""
    parts = urlsplit(url)
    path = "/".join("***" if _token_like(seg) else seg for seg in parts.path.split("/"))
    tail = ("?***" if parts.query else "") + ("#***" if parts.fragment else "")
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return mask_url_credentials(f"{parts.scheme}://{netloc}{path}") + tail


def mask_urls(text: str) -> str:
    """Every http(s) URL in `text` as `shown_url` shows it (the doctor bundle, logs read back)."""
    return _URL.sub(lambda m: shown_url(m.group(0)), text)


def check_url(url: str, *, option: str = "--notify") -> str:
    """An http(s) URL with a host and a valid port, without spaces or control characters; ConfigError naming
    `option` otherwise. The value is shown (masked) only when it came from the command line: a file's or a
    variable's content is never echoed (it may be a mistyped secret)."""
    shown = f"{option} {shown_url(url)!r}" if option == "--notify" else "the URL it holds"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{shown} is not an http(s) URL", where=option,
                          hint="give the webhook's full address, e.g. https://hooks.example.com/sparkctl")
    if any(ord(c) < 0x21 or ord(c) == 0x7f for c in url):
        raise ConfigError(f"{shown} holds a space or a control character", where=option,
                          hint="percent-encode it (%20) or remove it")
    try:
        _ = parts.port
    except ValueError:
        raise ConfigError(f"{shown} has a bad port", where=option, hint="a port is a number from 1 to 65535") \
            from None
    return url


def check_argv_url(url: str) -> str:
    """`--notify URL` from the command line: an http(s) URL without credentials (ConfigError naming what it holds and
    how to pass it instead)."""
    check_url(url)
    creds = url_credentials(url)
    if creds:
        raise ConfigError(f"--notify {shown_url(url)} carries {' and '.join(creds)}: a secret is never taken "
                          "from the command line", where="--notify", hint=HOW_TO_PASS)
    return url


def read_url_file(path: str) -> str:
    """The webhook URL in `path` (its first non-empty line): a regular file, at most 8 KiB, readable only by its
    owner when the URL carries credentials (refused otherwise, naming the chmod; sparkctl never changes it)."""
    p = Path(path).expanduser()
    try:
        with open(p, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"--notify-file {p} is not a regular file", where="--notify-file",
                                  hint="name a file holding the webhook's URL on one line")
            raw = fh.read(MAX_URL_FILE + 1)
    except OSError as exc:
        raise ConfigError(f"--notify-file {p} cannot be read: {exc.strerror or exc}", where="--notify-file",
                          hint="name a file this user can read, holding the webhook's URL on one line") from None
    if len(raw) > MAX_URL_FILE:
        raise ConfigError(f"--notify-file {p} is larger than {MAX_URL_FILE} bytes", where="--notify-file",
                          hint="the file holds one line: the webhook's URL")
    lines = [ln.strip() for ln in raw.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"--notify-file {p} is empty", where="--notify-file",
                          hint="write the webhook's URL on its first line")
    url = check_url(lines[0], option=f"--notify-file {p}")
    if url_credentials(url) and stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"--notify-file {p} holds a URL with credentials and other users may read it "
                          f"(mode {stat.S_IMODE(st.st_mode):04o})", where="--notify-file",
                          hint=f"chmod 600 {p}")
    return url


def read_url_env(name: str, environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ConfigError(f"--notify-env {name!r} is not a variable name", where="--notify-env",
                          hint="give the name of the variable holding the URL, e.g. --notify-env SPARKCTL_NOTIFY_URL")
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"--notify-env {name}: the variable is not set (or empty) here", where="--notify-env",
                          hint=f"export {name}=https://... before running sparkctl watch; for the systemd unit, "
                               "put it in the unit's EnvironmentFile (docs/watch.md)")
    return check_url(value, option=f"--notify-env {name}")


def secret_values(extra_env: tuple[str, ...] = ()) -> set[str]:
    """The values of the secret variables set in this environment (never sent anywhere)."""
    names = set(SECRET_ENV) | {n for n in extra_env if n}
    return {v for n in names if (v := os.environ.get(n)) and len(v) >= 4}


def scrub(value: JSONValue, secrets: set[str]) -> JSONValue:
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, "***")
        return value[:FIELD_LIMIT]
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    return value


class DeadlineExceeded(TimeoutError):
    pass


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"no complete answer within the {self.seconds:g} s deadline")
        return left


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every blocking call waits at most what is left of the request's deadline."""
    deadline: _Deadline

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(self.deadline.left())
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self.settimeout(self.deadline.left())
        super().sendall(data, flags)


class _DeadlineTLSSocket(ssl.SSLSocket):
    """The same over TLS (`ssl.SSLContext.sslsocket_class`); `deadline` is set on the class made per request."""
    deadline: _Deadline

    def recv_into(self, buffer: WriteableBuffer, nbytes: int | None = None, flags: int = 0) -> int:
        self.settimeout(self.deadline.left())
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        self.settimeout(self.deadline.left())
        return super().send(data, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self.settimeout(self.deadline.left())
        super().sendall(data, flags)


def _resolve(host: str, port: int, deadline: _Deadline) -> list[tuple[int, int, int, tuple[str, int]]]:
    """getaddrinfo within the deadline (it takes no timeout: a thread that is left behind when it is late)."""
    out: list[list[tuple[int, int, int, tuple[str, int]]]] = []
    errors: list[OSError] = []

    def look() -> None:
        try:
            out.append([(fam, typ, proto, (str(addr[0]), int(addr[1]))) for fam, typ, proto, _, addr in
                        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)])
        except OSError as exc:
            errors.append(exc)
        except UnicodeError as exc:
            errors.append(OSError(f"bad host name: {exc}"))

    worker = threading.Thread(target=look, name="sparkctl-notify-dns", daemon=True)
    worker.start()
    worker.join(deadline.left())
    if errors:
        raise errors[0]
    if not out:
        deadline.left()
        raise DeadlineExceeded(f"no complete answer within the {deadline.seconds:g} s deadline")
    return out[0]


def _connect(host: str, port: int, tls: bool, deadline: _Deadline) -> socket.socket:
    last: OSError = OSError(f"{host} has no address")
    for fam, typ, proto, addr in _resolve(host, port, deadline):
        sock = _DeadlineSocket(fam, typ, proto)
        sock.deadline = deadline
        try:
            sock.settimeout(deadline.left())
            sock.connect(addr)
        except OSError as exc:
            sock.close()
            if isinstance(exc, TimeoutError):
                raise
            last = exc
            continue
        if not tls:
            return sock
        ctx = ssl.create_default_context()
        ctx.sslsocket_class = type("_RequestTLSSocket", (_DeadlineTLSSocket,), {"deadline": deadline})
        try:
            sock.settimeout(deadline.left())      # the handshake: one call, bounded by this timeout in total
            return ctx.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
    raise last


def post(url: str, body: bytes, headers: dict[str, str], deadline_s: float) -> tuple[int, int]:
    """POST `body` to `url` within one total deadline; (status, bytes of the answer read, at most MAX_REPLY).
    OSError (TimeoutError when the deadline passed) or http.client.HTTPException on failure."""
    deadline = _Deadline(deadline_s)
    parts = urlsplit(url)
    host = parts.hostname or ""
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    sock = _connect(host, port, tls, deadline)
    conn = http.client.HTTPConnection(host, port)
    conn.sock = sock
    try:
        conn.putrequest("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                        skip_host=True, skip_accept_encoding=True)
        shown_host = f"[{host}]" if ":" in host else host
        conn.putheader("Host", shown_host + (f":{parts.port}" if parts.port else ""))
        if parts.username is not None:            # the user's own credentials, as the URL gives them
            auth = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            conn.putheader("Authorization", "Basic " + base64.b64encode(auth).decode())
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(len(body)))
        conn.putheader("Connection", "close")
        conn.endheaders(body)
        resp = conn.getresponse()                 # status line and headers: http.client bounds their size
        read = 0
        try:
            while read < MAX_REPLY and (chunk := resp.read1(MAX_REPLY - read)):
                read += len(chunk)
        except (OSError, http.client.HTTPException):
            pass                                  # the status is the answer; the rest was only drained
        return resp.status, read
    finally:
        conn.close()


def _why(exc: BaseException, deadline_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no complete answer within the {deadline_s:g} s deadline"
    detail = getattr(exc, "strerror", None) or str(exc)
    return f"{type(exc).__name__}: {detail}"[:200] if detail else type(exc).__name__


class Notifier:
    def __init__(self, url: str, *, secret_env: tuple[str, ...] = (), timeout_s: float = TIMEOUT_S) -> None:
        self.url = check_url(url)
        self.secret_env = secret_env
        self.timeout_s = timeout_s

    def payload(self, event: JSONObject, secret_env: tuple[str, ...] = ()) -> bytes:
        secrets = secret_values(self.secret_env + secret_env)
        body = json.dumps(scrub(event, secrets), sort_keys=True).encode()
        if len(body) > MAX_BODY:
            small = {k: v for k, v in event.items() if k not in ("detail", "error")}
            small["truncated"] = True
            body = json.dumps(scrub(small, secrets), sort_keys=True).encode()[:MAX_BODY]
        return body

    def send(self, event: JSONObject, reporter: Reporter, *, secret_env: tuple[str, ...] = ()) -> bool:
        """POST `event` (the values of `secret_env` variables and of the known secret ones replaced by ***) within
        one total deadline of `timeout_s`; True when the hook answered 2xx. Failures are reported, never raised."""
        where = shown_url(self.url)
        try:
            status, _ = post(self.url, self.payload(event, secret_env),
                             {"Content-Type": "application/json", "User-Agent": "sparkctl-watch"}, self.timeout_s)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reporter.event(f"notify: {where} failed ({mask_urls(_why(exc, self.timeout_s))}); the watcher goes on")
            return False
        if not 200 <= status < 300:
            reporter.event(f"notify: {where} answered {status}; the watcher goes on")
            return False
        return True
