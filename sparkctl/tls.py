"""One verifying TLS context for every HTTP client of this process.

Building a context loads the trust store (``ssl.create_default_context()``: the system's CA certificates), about
30-60 ms of CPU each time. httpx builds one for every client and every module-level ``httpx.get`` unless it is
given one, and sparkctl's clients are short-lived (a health poll, a gate, a status probe), so the loads were half
the CPU of an `up` on the embedded cluster (cProfile, docs/testing.md). Every client passes this one instead; the
context verifies exactly as before. Sharing one across clients and threads is what ``ssl.SSLContext`` is for.
"""
from __future__ import annotations

import functools
import ssl


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one client context (certificates verified, host names checked), made on first use."""
    return ssl.create_default_context()
