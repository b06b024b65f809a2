"""Every ``eval`` and ``bench`` option, checked before any work.

The commands call these first, in order, and only then read a corpus, load the model or create
a file: a bad value (an unknown fusion, a zero ``--rrf-k``, an ``--out`` that is a file, a
folder that is not a BEIR collection) is refused in about a second, with one line, instead of
after a ten-minute ingest. Each check raises :class:`OptionError` whose message is that line
(without the ``engram-memory: error:`` prefix the CLI adds).

Light on purpose: only the standard library and ``engram_memory.models`` (no torch, no engine).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from engram_memory.models.states import FusionMethod

ENGINE_CHANNELS = ("lexical", "semantic", "hybrid")  # eval.ingest.CHANNEL_SETS, without its imports
# "baseline" is standard BM25 (bm25s, eval/baseline.py) over the same collection: not an engine run.
CHANNEL_NAMES = ("baseline", *ENGINE_CHANNELS)
DEFAULT_CHANNELS = ",".join(CHANNEL_NAMES)
FUSIONS = tuple(m.value for m in FusionMethod)
MAPPINGS = ("single", "split")
MODELS = ("all-MiniLM-L6-v2", "multilingual-e5-small")  # models.settings.EMBEDDING_MODELS (tested equal)
PEERS = ("lancedb",)


class OptionError(ValueError):
    """A command-line value the commands refuse; ``str()`` is the one line to print."""


def _or(names: Sequence[str], word: str = "or") -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" {word} " + names[-1]


def integer(option: str, value: str | int | None, minimum: int = 1) -> int | None:
    """An integer >= ``minimum`` (None stays None: the option was not given)."""
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise OptionError(f"{option} takes a whole number >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise OptionError(f"{option} takes a whole number >= {minimum}, got {number}")
    return number


def csv_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def channels(value: str | Sequence[str]) -> list[str]:
    """``baseline,lexical,semantic,hybrid`` (any non-empty subset, each once, in the order given)."""
    names = csv_list(value) if isinstance(value, str) else [str(v).strip() for v in value]
    if not names:
        raise OptionError(f"--channels needs at least one of {_or(CHANNEL_NAMES)}")
    unknown = [n for n in names if n not in CHANNEL_NAMES]
    if unknown:
        raise OptionError(f"--channels: unknown channel {unknown[0]!r}; choose from {_or(CHANNEL_NAMES)}")
    return list(dict.fromkeys(names))


def fusion(value: str | None) -> str | None:
    if value is None:
        return None
    name = value.strip().lower()
    if name not in FUSIONS:
        raise OptionError(f"--fusion: unknown method {value!r}; choose from {_or(FUSIONS)}")
    return name


def weights(value: str | Sequence[float] | None) -> tuple[float, float] | None:
    """``lexical,semantic``: two finite numbers >= 0, not both 0."""
    if value is None:
        return None
    parts = csv_list(value) if isinstance(value, str) else list(value)
    try:
        numbers = [float(p) for p in parts]
    except (TypeError, ValueError):
        raise OptionError(f"--weights takes two numbers lexical,semantic (e.g. 0.4,0.6), got {value!r}") from None
    if len(numbers) != 2:
        raise OptionError(f"--weights takes two numbers lexical,semantic (e.g. 0.4,0.6), got {len(numbers)}")
    if not all(math.isfinite(n) and n >= 0 for n in numbers) or not any(n > 0 for n in numbers):
        raise OptionError(f"--weights must be two finite numbers >= 0, not both 0, got {value!r}")
    return numbers[0], numbers[1]


def fusion_settings(run_channels: Sequence[str], method: str | None, rrf_k: int | None,
                    fusion_weights: tuple[float, float] | None) -> None:
    """The fusion options must change something: a hybrid run, and the method they belong to.

    Without a hybrid run nothing is fused; ``--rrf-k`` is read by RRF only and ``--weights`` by the
    score-based methods, so a combination the engine would silently ignore is refused. The result
    is also checked by the engine's own settings model (what a run would build later).
    """
    given = [name for name, v in (("--fusion", method), ("--rrf-k", rrf_k), ("--weights", fusion_weights))
             if v is not None]
    if not given:
        return
    if "hybrid" not in run_channels:
        verb = "changes" if len(given) == 1 else "change"
        raise OptionError(f"{_or(given, 'and')} only {verb} the hybrid run, and --channels {','.join(run_channels)} "
                          "has none; add hybrid")
    from engram_memory.models.settings import EngineSettings

    default = EngineSettings.model_fields["fusion"].default
    effective = method or str(getattr(default, "value", default))
    if rrf_k is not None and effective != FusionMethod.RRF.value:
        raise OptionError(f"--rrf-k is the RRF constant; the fusion is {effective}"
                          + ("" if method else " (the engine's default)") + ": add --fusion rrf")
    if fusion_weights is not None and effective == FusionMethod.RRF.value:
        raise OptionError("--weights weighs dbsf or convex fusion; RRF takes no weights (use --rrf-k)")
    overrides: dict[str, object] = {}
    if method is not None:
        overrides["fusion"] = method
    if rrf_k is not None:
        overrides["rrf_k"] = rrf_k
    if fusion_weights is not None:
        overrides["fusion_weights"] = fusion_weights
    try:
        EngineSettings.model_validate(overrides)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = exc.errors() if hasattr(exc, "errors") else []
        why = errors[0]["msg"] if errors else str(exc).splitlines()[0]
        raise OptionError(f"the engine refuses these fusion settings: {why}") from None


def choice(option: str, value: str | None, allowed: Sequence[str]) -> str | None:
    if value is None:
        return None
    name = value.strip()
    if name not in allowed:
        raise OptionError(f"{option}: unknown value {value!r}; choose from {_or(allowed)}")
    return name


def peer_available(peer: str | None) -> None:
    """``--peer lancedb`` needs the bench extra: say so now, not after the ingest."""
    if peer != "lancedb":
        return
    from engram_memory.eval import peer_lancedb

    why = peer_lancedb.unavailable()
    if why:
        raise OptionError(f"--peer lancedb: {why}")


def baseline_available(run_channels: Sequence[str]) -> None:
    """The ``baseline`` run needs bm25s and PyStemmer (the eval extra): say so now, not after the ingest."""
    if "baseline" not in run_channels:
        return
    from engram_memory.eval.baseline import unavailable

    why = unavailable()
    if why:
        raise OptionError(f"--channels baseline: {why}")


def writable_dir(option: str, path: Path | None, required: bool = True) -> Path | None:
    """A folder the run can create or write into, without creating anything now."""
    if path is None:
        if required:
            raise OptionError(f"{option} DIR is required (where the run writes its files)")
        return None
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise OptionError(f"{option} {path}: is a file, not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OptionError(f"{option} {path}: folder is not writable")
        return path
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OptionError(f"{option} {path}: cannot be created, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OptionError(f"{option} {path}: cannot be created, {parent} is not writable")
    return path


def sizes(value: str) -> list[int]:
    """``1000,10000``: positive store sizes, sorted, each once."""
    parts = csv_list(value)
    if not parts:
        raise OptionError("--sizes needs at least one store size, e.g. 1000,10000")
    out = set()
    for part in parts:
        try:
            number = int(part)
        except ValueError:
            raise OptionError(f"--sizes takes whole numbers, e.g. 1000,10000; got {part!r}") from None
        if number < 1:
            raise OptionError(f"--sizes takes positive store sizes, got {number}")
        out.add(number)
    return sorted(out)


def store(url: str | None, master_key_file: Path | None) -> tuple[str, Path] | None:
    """``--store URL --master-key-file FILE``: run the engine on an initialised PostgreSQL store
    (each collection in its own scope) instead of a DuckDB store in the cache dir."""
    from engram_memory.store.opening import check_store_options  # the driver's URL parser, no connection

    try:
        check_store_options(url, master_key_file)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    if url is None or master_key_file is None:
        return None
    if not Path(master_key_file).is_file():
        raise OptionError(f"--master-key-file {master_key_file} is not a file")
    return url, Path(master_key_file)
