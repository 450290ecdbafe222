"""The environment of a helper process sparkctl starts (the log pipe, the router, pip, the registry's collector).

A helper gets what it needs to run and nothing else: an allowlist, not a list of secrets to drop, so a token in a
variable sparkctl has never heard of (AWS_SECRET_ACCESS_KEY, a CI's deploy key) never reaches a helper's
/proc/PID/environ either. The engine's own environment is another matter (the profile's env, the node's
engine_env, the caller's environment minus the rank's secrets): the process runtime hands it to the engine alone.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

# What a process needs to find programs, write temporary files, speak a locale and reach a Docker daemon.
KEEP = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "XDG_RUNTIME_DIR",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
    "DOCKER_CONTEXT", "RUST_LOG", "RUST_BACKTRACE", "NO_COLOR",
})
KEEP_PREFIXES = ("LC_",)
# A helper that downloads (pip) also needs the proxy and its package index settings.
NETWORK_SUFFIXES = ("_proxy", "_PROXY")
NETWORK_PREFIXES = ("PIP_",)


def helper_env(*, network: bool = False, extra: Mapping[str, str] | None = None,
               environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlisted part of `environ` (default: this process's), with the download settings when `network`,
    and `extra` on top."""
    src = os.environ if environ is None else environ
    env = {k: v for k, v in src.items()
           if k in KEEP or k.startswith(KEEP_PREFIXES)
           or network and (k.endswith(NETWORK_SUFFIXES) or k.startswith(NETWORK_PREFIXES))}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(extra or {})
    return env
