"""testrig.testcpu: a test's CPU in the worker and in the children it reaped, one appended line per test."""
from __future__ import annotations

import json
import subprocess
import sys

from testrig.testcpu import measured, summarize


def test_own_and_reaped_children_cpu_are_each_counted(tmp_path):
    log = tmp_path / "cpu.jsonl"
    with measured("tests/x.py::busy_child", str(log)):
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.3: pass"], check=True)
    with measured("tests/x.py::busy_self", str(log)):
        import time
        t = time.process_time()
        while time.process_time() - t < 0.3:
            pass
    child, own = (json.loads(line) for line in log.read_text().splitlines())
    assert child["test"] == "tests/x.py::busy_child" and child["children_cpu_s"] >= 0.3, child
    assert own["own_cpu_s"] >= 0.3 and own["children_cpu_s"] < 0.1, own
    text = summarize(str(log))
    assert text.startswith("2 tests, ") and "tests/x.py" in text


def test_nothing_is_written_without_a_path(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKCTL_TEST_CPU_LOG", raising=False)
    with measured("tests/x.py::t"):
        pass
    assert list(tmp_path.iterdir()) == []
