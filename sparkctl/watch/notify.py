"""`--notify URL`: one JSON POST per restart and per give-up, bounded and free of secrets.

Bounds: connect/read/write timeouts of `TIMEOUT_S` each, a body of at most `MAX_BODY` bytes (longer text fields
are cut), at most `MAX_REPLY` bytes of the answer read, no redirects followed. The payload is built from fixed
fields (event, cluster, desired state, reason, evidence, counts, time); the values of the secret variables sparkctl
knows (the profile's API key variable, HF_TOKEN ...) are replaced by ``***`` wherever they appear, headers carry no
credentials of sparkctl's, and the URL is never logged with its credentials or query string. A webhook that fails
is one line on stderr; it never stops the supervisor. Example::

    Notifier("https://hooks.example/sparkctl").send({"event": "restart", ...}, reporter)
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject, JSONValue
from sparkctl.sglang.launch import SECRET_ENV
from sparkctl.untrusted import mask_url_credentials

if TYPE_CHECKING:
    from sparkctl.deploy.progress import Reporter

TIMEOUT_S = 5.0
MAX_BODY = 16 * 1024
MAX_REPLY = 64 * 1024
FIELD_LIMIT = 2000


def shown_url(url: str) -> str:
    """The URL as it may appear in a log line: credentials masked, any query string or fragment hidden."""
    parts = urlsplit(url)
    tail = ("?***" if parts.query else "") + ("#***" if parts.fragment else "")
    return mask_url_credentials(f"{parts.scheme}://{parts.netloc}{parts.path}") + tail


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--notify {shown_url(url)!r} is not an http(s) URL", where="--notify",
                          hint="give the webhook's full address, e.g. --notify https://hooks.example.com/sparkctl")
    return url


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
        """POST `event` (the values of `secret_env` variables and of the known secret ones replaced by ***); True
        when the hook answered 2xx. Failures are reported, never raised."""
        import httpx

        where = shown_url(self.url)
        try:
            with httpx.Client(timeout=httpx.Timeout(self.timeout_s), follow_redirects=False,
                              trust_env=False) as client, \
                    client.stream("POST", self.url, content=self.payload(event, secret_env),
                                  headers={"content-type": "application/json", "user-agent": "sparkctl-watch"}) as resp:
                read = 0
                for chunk in resp.iter_bytes():
                    read += len(chunk)
                    if read >= MAX_REPLY:
                        break
                ok = 200 <= resp.status_code < 300
        except httpx.HTTPError as exc:
            reporter.event(f"notify: {where} failed ({type(exc).__name__}); the watcher goes on")
            return False
        if not ok:
            reporter.event(f"notify: {where} answered {resp.status_code}; the watcher goes on")
        return ok
