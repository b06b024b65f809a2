"""Which packages the distribution holds: the design card's top-level folders, installed under one
namespace (``engram_memory.models``, ``engram_memory.store.duckdb``, ...). Every package below them
is found here, so a new sub-package needs no edit; data files inside them are shipped through
MANIFEST.in. Everything else about the project is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

FOLDERS = ("models", "store", "retrieval", "server", "eval", "checks")


def _subpackages(folder: str) -> list[str]:
    # Data folders (templates, static files, corpora, weights) are namespace packages to Python:
    # listing them keeps setuptools from warning, on every install, that it would ignore them.
    return [name for name in find_namespace_packages(folder, exclude=["*__pycache__*"])
            if all(part.isidentifier() for part in name.split("."))]


setup(
    packages=[f"engram_memory.{folder}{'.' + sub if sub else ''}"
              for folder in FOLDERS for sub in ("", *_subpackages(folder))],
    package_dir={f"engram_memory.{folder}": folder for folder in FOLDERS},
    # The wheel's files are stored, not deflated: nine tenths of it is the model's float weights, which
    # deflate shrinks by a sixth at ~5 s of the 12 s a `pip install .` spends building the wheel.
    options={"bdist_wheel": {"compression": "stored"}},
)
