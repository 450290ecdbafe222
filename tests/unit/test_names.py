"""One name, one meaning (issue 33, item 3): no two classes in sparkctl/ share a public name, so a name read in a
traceback, a log or a review points at one class. (Private helpers, `_Out` and the like, are each module's own.)
A failure names the class and every module defining it, e.g. ``Journal: sparkctl/deploy/apply.py,
sparkctl/state/tunejournal.py``."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def shared_class_names(package: Path) -> list[str]:
    """Each public class name defined at module level in more than one module under `package`."""
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(path.relative_to(package.parent).as_posix())
    return [f"{name}: {', '.join(files)}" for name, files in sorted(where.items()) if len(files) > 1]


def test_no_two_classes_share_a_name():
    assert shared_class_names(ROOT / "sparkctl") == []


def test_the_check_names_both_homes(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "x.py").write_text("class Journal:\n    pass\nclass _Out:\n    pass\n")
    (pkg / "y.py").write_text("class Journal:\n    pass\nclass _Out:\n    pass\n")
    assert shared_class_names(pkg) == ["Journal: pkg/a/x.py, pkg/y.py"]
