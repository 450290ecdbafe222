"""Tests' bounded client load: requests through an endpoint while something changes behind it (a rolling update).

    with Traffic(endpoint, clients=4, at_least=50, at_most=1000, max_new_tokens=64) as load:
        result = deployer.up(p2)          # the change, under load
    assert load.failures == [] and load.during > 0

Each client sends `/generate` requests one after the other: at least `at_least` each, then on until the change is
over (the `with` block left) and `after` more beyond it, never more than `at_most` each, so the change runs under
load however fast the machine is and the loop always ends. `done` counts the requests answered so far (a test
waits on it to let traffic flow before or between its steps). Failures (non-200, transport errors, and with
`exact_tokens` a 200 whose completion_tokens is not `max_new_tokens`) are kept with their text. `pause_s` spaces
each client's requests (a real engine on a CPU: the load need not take every core from the change it proves).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx


class Traffic:
    def __init__(self, endpoint: str, *, clients: int, at_least: int, at_most: int, max_new_tokens: int,
                 after: int = 0, exact_tokens: bool = False, timeout_s: float = 60.0, join_s: float = 300.0,
                 pause_s: float = 0.0) -> None:
        self.endpoint, self.clients, self.at_least, self.at_most = endpoint, clients, at_least, at_most
        self.after, self.exact_tokens = after, exact_tokens
        self.max_new_tokens, self.timeout_s, self.join_s = max_new_tokens, timeout_s, join_s
        self.pause_s = pause_s                # each client's wait between two requests (a real engine on a CPU: the
        #                                       load proves the change, it need not take the machine's every core)
        self.failures: list[str] = []
        self.done = 0
        self.started: list[float] = []        # when each request started
        self.began: float | None = None       # the change's start and end (the `with` block)
        self.ended: float | None = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Any] = []

    @property
    def during(self) -> int:
        """Requests started while the change ran."""
        assert self.began is not None and self.ended is not None
        return sum(1 for t in self.started if self.began <= t < self.ended)

    def _client(self, k: int) -> None:
        with httpx.Client(timeout=self.timeout_s, trust_env=False) as c:
            beyond = 0                        # requests sent after the change was over
            for i in range(self.at_most):
                if i >= self.at_least and self.ended is not None:
                    if beyond == self.after:
                        break
                    beyond += 1
                with self._lock:
                    self.started.append(time.monotonic())
                try:
                    r = c.post(self.endpoint + "/generate", json={
                        "text": f"c{k} {i}", "sampling_params": {"max_new_tokens": self.max_new_tokens}})
                    if r.status_code != 200 or (self.exact_tokens and r.json()["meta_info"]["completion_tokens"]
                                                != self.max_new_tokens):
                        self.failures.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                with self._lock:
                    self.done += 1
                if self.pause_s:
                    time.sleep(self.pause_s)

    def __enter__(self) -> Traffic:
        self._pool = ThreadPoolExecutor(self.clients)
        self._futures = [self._pool.submit(self._client, k) for k in range(self.clients)]
        self.began = time.monotonic()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ended = time.monotonic()
        assert self._pool is not None
        try:
            for f in self._futures:
                f.result(timeout=self.join_s)
        finally:
            self._pool.shutdown(wait=False)
