"""The docs stay true: the reference is what the CLI and the models generate, the README stays short and opens
with the two commands, and every link between the docs lands on a file and a heading that exist."""
from __future__ import annotations

import difflib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_LIMIT = 8192
# The two commands the README opens with, verbatim (the embedded-cluster deploy and the whole test suite).
OPENING = (
    ("./bin/sparkctl up --profile d5    # main job: deploy the seed's D5 profile on the embedded local cluster "
     "(emulated engine)"),
    ("./bin/test                        # the whole test suite (what .ci/run runs; as root it also brings up the "
     "two-node test cluster)"),
)
# Linked before it lands: docs/watch.md is being written alongside (the supervisor).
PENDING = {DOCS / "watch.md"}


def test_reference_is_generated_from_the_cli_and_models():
    from sparkctl.cli.docgen import REGENERATE, reference
    path = DOCS / "reference.md"
    want = reference()
    have = path.read_text(encoding="utf-8") if path.is_file() else ""
    if have != want:
        diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), "docs/reference.md",
                                                 "generated", n=0))[:20])
        raise AssertionError(f"{path} is stale (the CLI or the config models changed since it was generated): "
                             f"regenerate it from the checkout root with `{REGENERATE}` and commit it\n{diff}")


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, (f"README.md is {size} bytes, over {README_LIMIT}: move the detail into docs/ "
                                  f"(guide.md, architecture.md, testing.md, benchmarks.md) and link it")


def test_readme_opens_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("# "), "README.md: the first line is its title (`# sparkctl...`)"
    body = [ln for ln in lines[1:] if ln.strip()]
    fence = body[:4]
    assert fence[:1] == ["```sh"] and fence[3:4] == ["```"] and tuple(fence[1:3]) == OPENING, (
        "README.md must open, right after its title, with the two commands verbatim in one ```sh block:\n"
        + "\n".join(OPENING) + "\nfound:\n" + "\n".join(fence))


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, flags=re.MULTILINE)}


def test_links_between_the_docs_land():
    broken = []
    for doc in [README, *sorted(DOCS.glob("*.md"))]:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue                       # http(s), mailto: not checked here
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            if dest in PENDING:
                continue
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: ({target}): no file {dest}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: ({target}): no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, "links that do not land (fix the link or the heading):\n" + "\n".join(broken)
