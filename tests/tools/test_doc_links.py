"""The documentation's links resolve: every relative link and image in the README, docs/ and the folders' READMEs
names a file of the repository, and every #anchor a heading of the page it points at (GitHub's heading ids)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "tests" / "README.md", ROOT / "tools" / "README.md", *sorted((ROOT / "tools").glob("*/README.md")),
         *sorted((ROOT / "bench").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def prose(text):
    """The page without its code blocks and inline code, where brackets are not links."""
    return CODE.sub("", FENCE.sub("", text))


def anchors(page):
    """GitHub's ids for a page's headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen, ids = {}, set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        ids.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return ids


def test_the_pages_exist():
    assert all(p.is_file() for p in PAGES)
    assert len(PAGES) > 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT not in dest.parents:
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], broken
