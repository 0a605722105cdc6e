"""Every relative link in every Markdown file of the repository resolves inside it: a clone
carries the whole contract, and nothing points at files it does not have."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
# [text](target) and [text](<target> "title"); images too. Code spans and fences are cut first.
LINK = re.compile(r"\]\(\s*(?:<([^>\n]+)>|([^)\s]+))(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^\s*(```|~~~).*?^\s*\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|//|#)", re.IGNORECASE)


def markdown_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.md"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    return sorted(f for f in listed.split("\0") if f and (ROOT / f).is_file())


def targets(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code."""
    text = CODE.sub("", FENCE.sub("", text))
    return ["".join(link) for link in LINK.findall(text)] + REFERENCE.findall(text)


def broken(source: str) -> list[str]:
    """The relative links of ``source`` whose file is missing or outside the repository."""
    path = ROOT / source
    found = []
    for target in targets(path.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue  # http(s), mailto and the like, or an anchor in the same file
        file = unquote(target.split("#", 1)[0].split("?", 1)[0])
        resolved = (ROOT / file.lstrip("/")) if file.startswith("/") else (path.parent / file)
        resolved = resolved.resolve()
        if not resolved.is_relative_to(ROOT):
            found.append(f"{target}: outside the repository")
        elif not resolved.exists():
            found.append(f"{target}: no such file")
    return found


def test_the_link_finder_sees_what_a_reader_follows() -> None:
    text = (
        '[a](docs/spec.md) ![i](img.png "t") [b](<with space.md>) [web](https://x.test/y) '
        "[m](mailto:a@b.test) [s](#section) `[c](code.md)`\n"
        "```\n[d](fenced.md)\n```\n[ref]: ../shared/SPEC.md\n"
    )
    assert targets(text) == [
        "docs/spec.md",
        "img.png",
        "with space.md",
        "https://x.test/y",
        "mailto:a@b.test",
        "#section",
        "../shared/SPEC.md",
    ]


@pytest.mark.parametrize("source", markdown_files())
def test_every_relative_link_resolves_inside_the_repository(source: str) -> None:
    assert broken(source) == []


ISSUE = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)


def test_no_file_cites_an_issue_number() -> None:
    """The project carries its own contract: code, tests and docs cite docs/spec.md's rules and
    sections, never a tracker's issue that a clone does not have. bench/RESULTS.md, a dated log
    of measurements, may say which issue a figure was measured for."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout
    citing = []
    for name in listed.split("\0"):
        path = ROOT / name
        if not name or name == "bench/RESULTS.md" or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        citing += [f"{name}: {m.group(0)}" for m in ISSUE.finditer(text)]
    assert not citing
