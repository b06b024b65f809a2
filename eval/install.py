"""What a user installs, measured: the wheel built from a checkout, installed into a fresh venv.

``engram-memory bench-install --source CLONE --out DIR`` builds the wheel (``pip wheel``), installs
it into a new venv outside the source tree (no ``-e``, no path into the clone), and measures the
issue-32 targets against their floors: install time with a warm pip cache (≤ 25 s), the venv's
size (≤ 450 MB), and how long after launch the semantic channel answers a hybrid search with an
empty model cache (≤ 3 s; the graph is assembled from the packaged weights on that first launch).
It writes DIR/install.json and prints each figure with its ratio to the target. The install it
makes is the one tests/test_wheel.py runs the golden transcript against.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

# Packages the default install must never bring: the reference runtime is the `torch` extra.
TORCH_STACK = ("torch", "transformers", "sentence-transformers")
TARGETS = {"install_seconds": 25.0, "venv_mb": 450.0, "semantic_ready_seconds": 3.0}
# Left behind by a build or an editable install: never part of what is built.
_NOT_SOURCE = (".venv", ".git", "build", "dist", "*.egg-info", "out", ".mypy_cache", "__pycache__",
               ".pytest_cache", ".ruff_cache", "site")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    seconds: float  # pip upgrading itself, then installing the wheel and its dependencies

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def command(self) -> Path:
        return self.venv / "bin" / "engram-memory"

    def packages(self) -> dict[str, str]:
        """Installed distributions, lower-cased name -> version (``pip list``)."""
        done = subprocess.run([str(self.python), "-m", "pip", "list", "--format", "json"], capture_output=True,
                              text=True, check=True, timeout=120)
        return {row["name"].lower(): row["version"] for row in json.loads(done.stdout)}

    def size_mb(self) -> float:
        total = sum(p.stat().st_size for p in self.venv.rglob("*") if p.is_file() and not p.is_symlink())
        return total / 1e6


def build_wheel(source: Path, out: Path) -> Path:
    """``pip wheel`` of a copy of ``source`` (a build writes build/ and egg-info beside its sources)."""
    copy = out / "src"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(copy)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel failed: {done.stderr[-2000:]}")
    [wheel] = out.glob("engram_memory-*.whl")
    shutil.rmtree(copy)
    return wheel


def install_fresh(wheel: Path, venv: Path, extras: str = "") -> Installed:
    """A new venv with ``wheel`` (and ``extras``) installed from the package index, as a user does."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    t0 = time.monotonic()
    # The README's first command: a current pip first (the one a venv bundles resolves 2-3x slower).
    for argv in ([*pip, "--upgrade", "pip"], [*pip, target]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, cwd=str(venv))
        if done.returncode != 0:
            raise RuntimeError(f"pip install failed: {done.stderr[-3000:]}")
    return Installed(wheel, venv, time.monotonic() - t0)


def semantic_ready_seconds(installed: Installed, work: Path) -> float:
    """Seconds from launching ``engram-memory serve`` (empty model cache) until a search that requires
    both channels answers: the one-time graph assembly and model load included."""
    probe = work / "ready_probe.py"
    probe.write_text(_READY_PROBE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "ENGRAM_MODEL_CACHE": str(work / "model-cache"),
                "XDG_DATA_HOME": str(work / "xdg")})
    done = subprocess.run([sys.executable, str(probe), str(installed.command), str(work / "ready-data")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(work))
    if done.returncode != 0:
        raise RuntimeError(f"the readiness probe failed: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


# Run by the caller's interpreter (it has the mcp SDK), against the installed command.
_READY_PROBE = '''
import sys, time, anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

async def main(command, data_dir):
    argv = ["serve", "--data-dir", data_dir, "--tenant", "t", "--workspace", "w", "--principal", "p",
            "--agent-id", "a", "--purpose-ref", "purpose:ready", "--tools", "search"]
    t0 = time.monotonic()
    async with stdio_client(StdioServerParameters(command=command, args=argv)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            args = {"query": "ready", "purpose_ref": "purpose:ready",
                    "capability_policy": {"minimum_channels": "lexical_and_semantic", "network": "forbid"}}
            while True:
                result = await session.call_tool("engram_memory_search", args)
                if (result.structured_content or {}).get("ok"):
                    print(f"{time.monotonic() - t0:.3f}")
                    return
                if time.monotonic() - t0 > 300:
                    raise SystemExit("the semantic channel never came up")
                await anyio.sleep(0.05)

anyio.run(main, sys.argv[1], sys.argv[2])
'''


def bench_install_cmd(
    source: Annotated[Path, typer.Option("--source", help="The checkout to build the wheel from.")] = Path("."),
    out: Annotated[Path | None, typer.Option("--out", help="Output dir: install.json (and the venv). Required.",
                                             show_default=False)] = None,
) -> None:
    """Build the wheel, install it into a fresh venv, and measure install time, venv size and how soon
    the semantic channel answers after the first launch."""
    if out is None:
        sys.stderr.write("engram-memory: error: --out is required\n")
        raise typer.Exit(2)
    if not (source / "pyproject.toml").is_file():
        sys.stderr.write(f"engram-memory: error: --source {source} is not a checkout (no pyproject.toml)\n")
        raise typer.Exit(2)
    if out.exists() and any(out.iterdir()):
        sys.stderr.write(f"engram-memory: error: --out {out} is not empty\n")
        raise typer.Exit(2)
    out.mkdir(parents=True, exist_ok=True)
    say = lambda message: sys.stderr.write(f"bench-install: {message}\n")  # noqa: E731
    say("building the wheel")
    t0 = time.monotonic()
    wheel = build_wheel(source.resolve(), out)
    build_seconds = time.monotonic() - t0
    say("installing it into a fresh venv (once to warm the pip cache, then timed)")
    install_fresh(wheel, out / "warm-venv")
    shutil.rmtree(out / "warm-venv")
    installed = install_fresh(wheel, out / "venv")
    say("launching it with an empty model cache")
    ready = semantic_ready_seconds(installed, out)
    packages = installed.packages()
    figures = {"install_seconds": round(installed.seconds, 1), "venv_mb": round(installed.size_mb(), 1),
               "semantic_ready_seconds": round(ready, 2)}
    # Not a target: `pip install .` (the README's command) builds the wheel first, then installs it.
    report = {"wheel": wheel.name, "wheel_mb": round(wheel.stat().st_size / 1e6, 1),
              "build_seconds": round(build_seconds, 1), "python": sys.version.split()[0], "figures": figures,
              "targets": TARGETS,
              "ratios": {k: round(v / TARGETS[k], 2) for k, v in figures.items()},
              "torch_stack_installed": sorted(p for p in TORCH_STACK if p in packages),
              "packages": len(packages)}
    (out / "install.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for key, value in figures.items():
        sys.stdout.write(f"{key:24} {value:>8} (target {TARGETS[key]:g}: {value / TARGETS[key]:.2f}x)\n")
    sys.stdout.write(f"{'build_seconds':24} {report['build_seconds']:>8} (pip wheel of the checkout: `pip install .` "
                     "spends it before installing)\n")
    sys.stdout.write(f"torch stack installed: {report['torch_stack_installed'] or 'none'}\n")
