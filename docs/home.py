"""MkDocs hook: the site's home page is README.md itself, so the front page is written once.

The README links its guides and images as `docs/NAME` (right on GitHub and PyPI, where the README
sits at the repository's root); on the site the home page sits beside them, so the prefix goes.
Every link is then checked like any page's by `mkdocs build --strict`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parent.parent / "README.md"
_DOCS_LINK = re.compile(r"\]\(docs/")


def home_page(readme: str) -> str:
    """The README as the site's home page: links into docs/ made relative to docs/."""
    return _DOCS_LINK.sub("](", readme)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "index.md", content=home_page(README.read_text(encoding="utf-8"))))
    return files
