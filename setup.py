"""Which packages the distribution holds: the design card's top-level folders, installed under one
namespace (``engram_memory.models``, ``engram_memory.store.duckdb``, ...). Every package below them
is found here, so a new sub-package needs no edit; data files inside them are shipped through
MANIFEST.in. Everything else about the project is in pyproject.toml."""

from setuptools import find_packages, setup

FOLDERS = ("models", "store", "retrieval", "server", "eval", "checks")

setup(
    packages=[f"engram_memory.{folder}{'.' + sub if sub else ''}"
              for folder in FOLDERS for sub in ("", *find_packages(folder))],
    package_dir={f"engram_memory.{folder}": folder for folder in FOLDERS},
)
