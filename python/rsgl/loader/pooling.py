"""How a Hugging Face folder's embedding is pooled, as sentence-transformers declares it:
`modules.json` names a Pooling module whose folder (e.g. `1_Pooling/config.json`) sets one
`pooling_mode_*` flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from rsgl.errors import ModelLoadError, UnsupportedModelError

Pooling = Literal["last", "mean", "cls"]

POOLING_MODULE = "sentence_transformers.models.Pooling"
# sentence-transformers' flags -> the core's pooling names.
POOLING_MODES: dict[str, Pooling] = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}


def sentence_transformers_pooling(folder: Path) -> Pooling | None:
    """The pooling `folder`'s sentence-transformers files declare; None without them."""
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return None
    modules = _read(modules_path)
    pooling = next((m for m in modules if isinstance(m, dict) and m.get("type") == POOLING_MODULE), None) if isinstance(modules, list) else None
    if pooling is None:
        return None
    config_path = folder / str(pooling.get("path", "")) / "config.json"
    config = _read(config_path) if config_path.is_file() else {}
    modes = [name for name, value in config.items() if name.startswith("pooling_mode_") and value] if isinstance(config, dict) else []
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise UnsupportedModelError(f"{config_path} pools by {' + '.join(modes) or 'no mode'}; rsgl pools embeddings by one of {', '.join(POOLING_MODES)}.")
    return POOLING_MODES[modes[0]]


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ModelLoadError(f"cannot read {path} ({error}); download it again.") from error
