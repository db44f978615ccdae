"""LoRA adapters in PEFT's folder format (`adapter_config.json` beside `adapter_model.safetensors`),
or in llama.cpp's GGUF LoRA files (`convert_lora_to_gguf.py` writes them from PEFT folders;
`llama-server --lora` takes them).

This finds and reads the files; the Rust core maps the weights (a GGUF file's under the names and in
the layout of the PEFT adapter it was made from) and checks them against the base model when the
engine starts (`rsgl._core.Engine(..., adapters=...)`), refusing an adapter whose shapes, rank or
targets it cannot serve with a ModelLoadError naming it.
"""

from __future__ import annotations

from pathlib import Path

from rsgl._core import ModelConfig, WeightStore
from rsgl._typing import JsonObject
from rsgl.errors import ModelLoadError
from rsgl.loader import read_json_object

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# What the core takes of an adapter: its name, its adapter_config.json, its weights mapped.
AdapterFiles = tuple[str, JsonObject, WeightStore]


def read_lora_adapter(name: str, path: str | Path, base: ModelConfig) -> AdapterFiles:
    """The adapter `name` in the PEFT folder or GGUF LoRA file `path`, for the base model of config `base`."""
    try:
        folder = Path(path).expanduser()
    except RuntimeError:  # "~user/..." of a user this machine does not have
        raise ModelLoadError(f"LoRA adapter {name!r}: {path} is not a folder (no such user's home)") from None
    if not name:
        raise ModelLoadError(f"the LoRA adapter at {folder} has an empty name")
    if folder.suffix == ".gguf" and folder.is_file():
        return (name, *WeightStore.open_gguf_lora(name, folder, base))
    if not folder.is_dir():
        raise ModelLoadError(
            f"LoRA adapter {name!r}: {folder} is not a folder (give the folder PEFT's save_pretrained wrote) nor a .gguf file (a GGUF LoRA adapter)"
        )
    missing = [file for file in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (folder / file).is_file()]
    if missing:
        hint = " (adapter_model.bin is not read: save the adapter with safe_serialization)" if (folder / "adapter_model.bin").is_file() else ""
        raise ModelLoadError(f"LoRA adapter {name!r}: {folder} has no {' or '.join(missing)}{hint}")
    config = read_json_object(folder / ADAPTER_CONFIG)
    return name, config, WeightStore.open_safetensors([folder / ADAPTER_WEIGHTS])


def read_lora_adapters(lora_paths: dict[str, str], base: ModelConfig) -> list[AdapterFiles]:
    """Every adapter of the engine option `lora_paths` (name -> folder or GGUF file) for the base model of config `base`."""
    return [read_lora_adapter(name, path, base) for name, path in sorted(lora_paths.items())]
