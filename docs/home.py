"""MkDocs hook: the site's home page is README.md itself, so the front page is written once.

The README links its guides and images as `docs/NAME` (right on GitHub, where the README sits at
the repository's root); on the site the home page sits beside them, so the prefix goes. A guide
links the front page as `../README.md`, which on the site is `index.md`. Every link is then checked
like any page's by `mkdocs build --strict`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parent.parent / "README.md"
_DOCS_LINK = re.compile(r"\]\(docs/")
_README_LINK = re.compile(r"\]\(\.\./README\.md(?=[#)])")


def home_page(readme: str) -> str:
    """The README as the site's home page: links into docs/ made relative to docs/."""
    return _DOCS_LINK.sub("](", readme)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """A guide's link to the front page, `../README.md#...`, is the site's `index.md#...`."""
    return _README_LINK.sub("](index.md", markdown)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "index.md", content=home_page(README.read_text(encoding="utf-8"))))
    return files
