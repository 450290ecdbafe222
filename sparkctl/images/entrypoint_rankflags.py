"""Entrypoint of a launch image whose document is schema 2: ``/etc/sparkctl/launch.json`` + this rank's environment ->
exec the engine. Reads schema 1 documents the same way `sparkctl.images.entrypoint` does.

Standard library only (it runs with the engine image's ``python3``). Schema 2 adds one item to the argv of a launch
document (`sparkctl.images.launchdoc`): ``{"if": NAME, "argv": [...]}``, a flag that some ranks carry and others do
not (vLLM's rank 0 serves the API with ``--host H --port P``, its other ranks are ``--headless``). The container says
which with ``NAME=1`` or ``NAME=0``; a container without ``NAME`` exits 2 naming it, like a missing per-rank value:
nothing is guessed. The items inside are those of the top level (a literal token, ``{"env": NAME}``, ``{"env": NAME,
"optional": true}``).

Why a second file: entrypoint.py's bytes are an input of every launch image tag whose document is schema 1 (every
SGLang launch image deployed), and plan.py ships the entrypoint that reads the document's schema, so those tags stay
as they are. ``--print`` prints the final argv as JSON (secret values as ``***``) instead of starting the engine.
Example (vLLM's rank 1 of two)::

    docker run -e SPARKCTL_ARG_NODE_RANK=1 -e SPARKCTL_FLAG_HOST=0 -e SPARKCTL_FLAG_HEADLESS=1 -e VLLM_HOST_IP=... IMAGE
"""
from __future__ import annotations

import json
import os
import sys

LAUNCH_JSON = os.environ.get("SPARKCTL_LAUNCH_JSON", "/etc/sparkctl/launch.json")
SECRET_ENV = ("SPARKCTL_ARG_API_KEY", "HF_TOKEN")


def _expand(items: list, environ: dict, argv: list[str], missing: list[str]) -> None:
    for item in items:
        if isinstance(item, str):
            argv.append(item)
        elif "if" in item:
            if item["if"] not in environ:
                missing.append(item["if"])
            elif environ[item["if"]] == "1":
                _expand(item["argv"], environ, argv, missing)
        elif item["env"] in environ:
            argv.append(environ[item["env"]])
        elif item.get("optional"):
            argv.pop()                       # no value for an optional (secret) flag: drop the flag too
        else:
            missing.append(item["env"])


def build(doc: dict, environ: dict) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv, env, missing names) for this container."""
    argv: list[str] = []
    missing: list[str] = []
    _expand(doc["argv"], environ, argv, missing)
    missing += [k for k in doc["rank_env"] if k not in environ]
    env = {**doc["env"], **environ}          # the container's own environment wins
    return argv, env, missing


def main(args: list[str]) -> int:
    try:
        with open(LAUNCH_JSON) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"sparkctl-entrypoint: cannot read {LAUNCH_JSON}: {exc}", file=sys.stderr)
        return 2
    if doc.get("schema") not in (1, 2):
        print(f"sparkctl-entrypoint: {LAUNCH_JSON} is schema {doc.get('schema')!r}; this entrypoint reads 1 and 2",
              file=sys.stderr)
        return 2
    argv, env, missing = build(doc, dict(os.environ))
    if missing:
        print(f"sparkctl-entrypoint: this container lacks {', '.join(missing)} (per-rank values of profile "
              f"{doc.get('profile')}); start it with sparkctl, or pass them with -e", file=sys.stderr)
        return 2
    if args[:1] == ["--print"]:
        hidden = {env[k] for k in SECRET_ENV if env.get(k)}
        print(json.dumps({"argv": ["***" if a in hidden else a for a in argv],
                          "env": {k: "***" if k in SECRET_ENV else v for k, v in sorted(env.items())}}))
        return 0
    os.execvpe(argv[0], argv + args, env)
    return 127  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
