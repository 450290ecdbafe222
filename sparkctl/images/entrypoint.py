"""Entrypoint of a sparkctl launch image: ``/etc/sparkctl/launch.json`` + this rank's environment -> exec SGLang.

Standard library only (it runs with the engine image's ``python3``). The launch document (see
`sparkctl.images.launchdoc`) holds the argv with placeholders ``{"env": NAME}`` for per-rank or secret values,
the shared environment, and ``rank_env``, the names the container must carry (set by the runtime from the
rendered LaunchSpec). A missing one exits 2 naming it; nothing is guessed. ``--print`` prints the final argv
as JSON (secret values as ``***``) instead of starting SGLang. Example::

    docker run -e SPARKCTL_ARG_NODE_RANK=1 -e SPARKCTL_ARG_HOST=0.0.0.0 -e SGLANG_HOST_IP=... IMAGE
"""
from __future__ import annotations

import json
import os
import sys

LAUNCH_JSON = os.environ.get("SPARKCTL_LAUNCH_JSON", "/etc/sparkctl/launch.json")
SECRET_ENV = ("SPARKCTL_ARG_API_KEY", "HF_TOKEN")


def build(doc: dict, environ: dict) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv, env, missing names) for this container."""
    argv, missing = [], []
    for item in doc["argv"]:
        if isinstance(item, str):
            argv.append(item)
        elif item["env"] in environ:
            argv.append(environ[item["env"]])
        elif item.get("optional"):
            argv.pop()                       # no value for an optional (secret) flag: drop the flag too
        else:
            missing.append(item["env"])
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
