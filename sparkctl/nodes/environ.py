"""The environment of a helper process sparkctl starts (the log pipe, the router, pip, the registry's collector,
ansible-playbook through ansible-runner: `prepare.runner.ansible_env`).

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


def allowed(key: str, *, network: bool = False, also: frozenset[str] = frozenset(),
            also_prefixes: tuple[str, ...] = ()) -> bool:
    """Whether a helper may inherit the variable `key`: the allowlist, the download settings when `network`, and
    what a particular helper needs besides (`also`, `also_prefixes`: Ansible's SSH agent and ANSIBLE_*)."""
    return (key in KEEP or key.startswith(KEEP_PREFIXES) or key in also or key.startswith(also_prefixes)
            or network and (key.endswith(NETWORK_SUFFIXES) or key.startswith(NETWORK_PREFIXES)))


def helper_env(*, network: bool = False, extra: Mapping[str, str] | None = None,
               environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlisted part of `environ` (default: this process's), with the download settings when `network`,
    and `extra` on top."""
    src = os.environ if environ is None else environ
    env = {k: v for k, v in src.items() if allowed(k, network=network)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(extra or {})
    return env
