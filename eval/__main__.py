"""``python -m eval eval|bench ...``: the same commands as ``engram-memory eval|bench``.

Until server/cli.py registers them (``app.command("eval")(eval_cmd)``,
``app.command("bench")(bench_cmd)``), this is how to run them.
"""

from __future__ import annotations

import typer

from engram_memory.eval.bench_import import bench_import_cmd
from engram_memory.eval.cli import bench_cmd, eval_cmd

app = typer.Typer(name="engram-memory", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)
app.command("eval")(eval_cmd)
app.command("bench")(bench_cmd)
app.command("bench-import")(bench_import_cmd)

if __name__ == "__main__":
    app()
