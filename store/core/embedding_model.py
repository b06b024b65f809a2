"""A store remembers the embedding model it was created with (``meta.embedding_model``, both backends).

Its value is JSON: the model's name (``{"model": "multilingual-e5-small"}``) or a local directory
(``{"model_path": "/models/x"}``), and once the model has loaded its ``model_id`` and
``model_digest``. A command that opens the engine without naming a model uses the store's; one that
names another is refused in one line (exit 2), since the store's vectors are that model's: only
``rebuild-index --model X`` switches a store (it re-embeds every record, and records the new model).
A store of an older version, which recorded nothing, records the model it is next opened with when it
holds no vectors yet or the command names the model; otherwise the default serves without being recorded.
"""

from __future__ import annotations

import json
from typing import Any

from engram_memory.models.settings import DEFAULT_MODEL, EngineSettings
from engram_memory.store.backend import Store, StoreRefused


class ModelMismatch(StoreRefused):
    """An explicit model that is not the store's (one line for the operator)."""


def _choice(settings: EngineSettings) -> dict[str, str]:
    """The model the settings name ({}: none)."""
    if settings.model_path is not None:
        return {"model_path": str(settings.model_path)}
    if settings.model is not None:
        return {"model": settings.model}
    return {}


def _recorded(db: Store) -> dict[str, Any] | None:
    raw = db.embedding_model()
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) and ("model" in value or "model_path" in value) else None


def _name(choice: dict[str, Any]) -> str:
    return f"--model-path {choice['model_path']}" if "model_path" in choice else f"--model {choice['model']}"


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("model") == b.get("model") and a.get("model_path") == b.get("model_path")


def adopt(settings: EngineSettings, db: Store, *, switch: bool = False) -> EngineSettings:
    """``settings`` with the store's model filled in; records the model of a store that has none
    (created now, or by an older version) and, with ``switch`` (rebuild-index), the one named.
    Raises ModelMismatch when the settings name a model that is not the store's."""
    given = _choice(settings)
    recorded = _recorded(db)
    if recorded is None or (switch and given and not _same(given, recorded)):
        chosen = given or {"model": DEFAULT_MODEL}
        # An older store that recorded nothing but holds vectors records a model only when one is
        # named: the default guessed for an e5 store opened once without --model would stick.
        guessed = recorded is None and not given and db.embedding_count() > 0
        if (settings.semantic or recorded is not None) and not guessed:
            db.record_embedding_model(json.dumps(chosen, sort_keys=True))
    elif given and not _same(given, recorded):
        where = settings.store and "the PostgreSQL store" or f"the store in {settings.data_dir}"
        raise ModelMismatch(f"{where} was created with {_name(recorded)}, not {_name(given)}: omit the option to"
                            f" use its model, or switch it with: engram-memory rebuild-index {_name(given)}"
                            " (re-embeds every record)")
    else:
        chosen = {k: recorded[k] for k in ("model", "model_path") if k in recorded}
    if "model_path" in chosen:
        return settings.model_copy(update={"model": None, "model_path": chosen["model_path"]})
    return settings.model_copy(update={"model": chosen["model"], "model_path": None})


def record_identity(db: Store, model_id: str | None, model_digest: str | None) -> None:
    """Once the model has loaded: its id and digest join the store's record (kept when equal)."""
    recorded = _recorded(db)
    if recorded is None or model_digest is None:
        return
    if recorded.get("model_digest") == model_digest and recorded.get("model_id") == model_id:
        return
    db.record_embedding_model(json.dumps({**recorded, "model_id": model_id, "model_digest": model_digest},
                                         sort_keys=True))
