"""The one redaction rule of sparkctl: secret values, the engine's secret server-args fields and secret flags hidden
wherever text is printed, logged or stored.

Its own module, with nothing but `re` imported, because the log pipe (`python -I -m sparkctl.nodes.logpipe`, one
process per rank started) applies it to every engine line: importing it from `sparkctl.sglang.launch` pulled in
pydantic, ~1 s of a rank's start at load (`python -X importtime -c "import sparkctl.nodes.logpipe"`).
"""
from __future__ import annotations

import re

REDACTED = "***"
# SGLang prints its server args at start-up, as the dataclass repr up to 0.5.16 (`server_args=ServerArgs(...,
# api_key='KEY', ...)`) and as a dict on 0.5.23 (`server_args={..., 'api_key': 'KEY', ...}`): the values of these
# fields are hidden in either form even when the value itself is not known to sparkctl.
_SECRET_FIELDS = re.compile(r"\b(?P<key>(?:admin_)?api_key|hf_token|ssl_keyfile_password)(?P<sep>=|['\"]:\s*)"
                            r"(?P<q>['\"])(?P<value>.*?)(?P=q)")


def redact(text: str, secrets: frozenset[str] | set[str] | list[str] | tuple[str, ...]) -> str:
    """`text` with every (non-empty) secret value replaced by '***': the one redaction rule of sparkctl.
    Longest first, so a secret that contains another is hidden whole."""
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return _SECRET_FIELDS.sub(lambda m: f"{m['key']}{m['sep']}{m['q']}{REDACTED}{m['q']}", text)


# Flags whose value is a credential when a spec does not name its own (the dialects' secret flags,
# sparkctl.sglang.dialect.Flag.secret), and environment variables that would hold one.
SECRET_OPTIONS = frozenset({"--api-key", "--admin-api-key", "--ssl-keyfile-password"})
SECRET_ENV = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SGLANG_API_KEY", "VLLM_API_KEY"})


def redact_argv(argv: list[str], secret_options: frozenset[str] | set[str]) -> list[str]:
    """argv with the value of every secret flag replaced by '***', by position (`--api-key X`, `--api-key=X`):
    redaction by field, so a number that happens to equal a secret is never hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        opt, eq, _ = arg.partition("=")
        if opt in secret_options:
            out.append(f"{opt}={REDACTED}" if eq else arg)
            hide_next = not eq
        else:
            out.append(arg)
    return out
