"""Every relative link in README.md, CONTRIBUTING.md and docs/*.md names a file that exists, and
an anchor (`page.md#section`, `#section`) names a heading of that page, as GitHub makes anchors
from headings. No processes, no network: links to http(s) and mailto are not followed."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INDENTED = re.compile(r"^(?: {4}|\t).*$", re.M)        # an indented code block's lines
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)", re.M)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text outside code, where a link is a link."""
    text = FENCE.sub("", text)
    text = INDENTED.sub("", text)
    return CODE_SPAN.sub("", text)


def links(text: str) -> list[str]:
    body = prose(text)
    return LINK.findall(body) + REFERENCE.findall(body)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (not `-` or `_`),
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link in a heading: its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _level, title in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_the_slugs_are_githubs():
    assert slug("Settings: flags, `HAREMQ_*`, a config file") == "settings-flags-haremq_-a-config-file"
    assert slug("Helm: Kubernetes") == "helm-kubernetes"
    assert slug("Open files (`ulimit -n`)") == "open-files-ulimit--n"
    assert links("see [a](b.md#c), `[not](x.md)`\n\n    [nor](y.md)\n") == ["b.md#c"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):       # http:, https:, mailto:
            continue
        path, _, anchor = unquote(target).partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_pages_are_all_checked():
    assert len(PAGES) >= 10 and all(p.exists() for p in PAGES)
