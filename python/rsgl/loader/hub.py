"""Models by their Hugging Face Hub id, through the Hugging Face cache (`huggingface_hub`).

    resolve("Qwen/Qwen3-0.6B")                         # a folder: config, tokenizer, safetensors
    resolve("unsloth/Qwen3-0.6B-GGUF:q8_0")            # one GGUF file (its first shard if split)

Only the files rsgl reads are fetched, into the cache every Hugging Face tool shares (`HF_HUB_CACHE`,
else `$HF_HOME/hub`), with `huggingface_hub`'s progress bars; what is cached is not fetched again.
`HF_HUB_OFFLINE=1` (or a Hub that cannot be reached) serves from the cache alone; `HF_TOKEN` opens
gated and private repos. A repo of GGUF files takes a quantization name after a colon, as
llama.cpp's `-hf` does; without one, the first of `DEFAULT_QUANTIZATIONS` it has, else its only model.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rsgl.errors import ModelLoadError

# The quantization a GGUF repo is served in when the id names none, in order of preference:
# 4-bit K-quants keep answers close to 16-bit at a quarter of the bytes; Q8_0 is next best.
DEFAULT_QUANTIZATIONS = ("Q4_K_M", "Q8_0")
# Which of a GGUF repo's projector files (llama.cpp's mmproj) comes with its model: the first whose name holds one of
# these, else the first in name order. A vision tower is small beside its model and hurt most by quantizing.
PROJECTOR_PREFERENCE = ("F16", "BF16", "F32", "Q8_0")
# What rsgl reads from a Hugging Face model folder, beside the weights: config, tokenizer, chat
# template, generation defaults, and sentence-transformers' pooling for embedding models.
FOLDER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
# "org/name" or "org/name:QUANT", as the Hub spells repo ids.
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<quantization>[\w.-]+))?")
# llama.cpp's gguf-split names: NAME-00001-of-00003.gguf.
_SHARD = re.compile(r"-(?P<index>\d{5})-of-(?P<count>\d{5})$")
# A quantization name at the end of a GGUF file's stem: Q4_K_M, IQ4_XS, Q8_0, BF16, F16, MXFP4...
_QUANTIZATION = re.compile(r"(?:^|[-._])(?P<name>(?:I?Q\d\w*|TQ\d\w*|B?F16|F32|MXFP4\w*))$", re.IGNORECASE)
_TRUE = ("1", "on", "yes", "true")


@dataclass(frozen=True)
class HubId:
    repo: str
    quantization: str | None

    def __str__(self) -> str:
        return f"{self.repo}:{self.quantization}" if self.quantization else self.repo


def parse_hub_id(model_path: str) -> HubId | None:
    """The Hub id `model_path` spells, or None for anything else (a local path, a typo'd one)."""
    match = _HUB_ID.fullmatch(model_path)
    if match is None or model_path.startswith((".", "~")) or ".." in model_path:
        return None
    return HubId(match["repo"], match["quantization"])


def hub_cache_dir() -> Path:
    """The Hugging Face cache, as `huggingface_hub` finds it, read when called."""
    from huggingface_hub import constants

    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME")
    return Path(home).expanduser() / "hub" if home else Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE or bool(constants.HF_HUB_OFFLINE)


def resolve(hub_id: HubId, revision: str | None = None) -> Path:
    """The local path of `hub_id`'s model, fetching what the cache lacks: its folder, or its GGUF
    file (the first shard of a split one)."""
    revision = revision or "main"
    files, snapshot = _repo_files(hub_id, revision)
    wanted, model_file = _choose_files(hub_id, files)
    if snapshot is not None:
        # A projector cached snapshots may lack (fetched before rsgl fetched projectors): the model runs on text.
        absent = [name for name in wanted if not (snapshot / name).is_file() and name != projector_of(files)]
        if absent:
            raise ModelLoadError(
                f"{hub_id} (revision {revision}) is in the Hugging Face cache ({hub_cache_dir()}) without {', '.join(absent)}, "
                f"and the Hub {_unreachable_reason()}. Run `rsgl pull {hub_id}` where the Hub is reachable."
            )
    else:
        snapshot = _download(hub_id, revision, wanted)
    return snapshot / model_file if model_file else snapshot


def _repo_files(hub_id: HubId, revision: str) -> tuple[list[str], Path | None]:
    """The repo's files at `revision`: listed by the Hub (snapshot None: fetch them), or, offline or
    when the Hub cannot be reached, those of the cached snapshot (and its folder)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError

    unreachable: tuple[type[Exception], ...] = (OfflineModeIsEnabled, HfHubHTTPError, *_transport_errors())
    if not offline():
        try:
            return HfApi().list_repo_files(hub_id.repo, revision=revision), None
        except GatedRepoError as error:
            raise ModelLoadError(
                f"{hub_id.repo} is a gated repo: accept its terms on https://huggingface.co/{hub_id.repo} and set HF_TOKEN "
                "to a token of that account (or run `hf auth login`)."
            ) from error
        except RepositoryNotFoundError as error:
            raise ModelLoadError(
                f"{hub_id.repo} is neither a local path nor a model repo on the Hugging Face Hub (a private repo needs HF_TOKEN); "
                "check the spelling, or pass a Hugging Face model folder or a .gguf file."
            ) from error
        except RevisionNotFoundError as error:
            raise ModelLoadError(f"{hub_id.repo} has no revision {revision!r} (a branch, tag or commit) on the Hub.") from error
        except unreachable as error:
            # Not reachable: what the cache holds will do.
            return _cached_files(hub_id, revision, error)
    return _cached_files(hub_id, revision, None)


def _transport_errors() -> tuple[type[Exception], ...]:
    """What a Hub that cannot be reached raises: OSError through `requests` (huggingface_hub 0.x),
    the HTTP client's transport errors from 1.0 on (httpx, httpx2), which are not OSErrors."""
    errors: list[type[Exception]] = [OSError]
    for client in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(client).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _cached_files(hub_id: HubId, revision: str, error: Exception | None) -> tuple[list[str], Path]:
    from huggingface_hub import scan_cache_dir

    cache = hub_cache_dir()
    repos = scan_cache_dir(cache).repos if cache.is_dir() else frozenset()
    repo = next((repo for repo in repos if repo.repo_id == hub_id.repo and repo.repo_type == "model"), None)
    cached = None if repo is None else next((r for r in repo.revisions if revision in r.refs or r.commit_hash.startswith(revision)), None)
    if cached is None:
        reason = f"the Hub {_unreachable_reason(error)}"
        what = f"no snapshot of {hub_id.repo}" if repo is None else f"{hub_id.repo} but not its revision {revision!r}"
        raise ModelLoadError(f"the Hugging Face cache ({cache}) holds {what}, and {reason}. Run `rsgl pull {hub_id}` where the Hub is reachable.")
    return sorted(file.file_path.relative_to(cached.snapshot_path).as_posix() for file in cached.files), cached.snapshot_path


def _unreachable_reason(error: Exception | None = None) -> str:
    if error is None and offline():
        return "is not asked (HF_HUB_OFFLINE is set)"
    return f"could not be reached ({type(error).__name__}: {error})" if error else "was not reached"


def _choose_files(hub_id: HubId, files: list[str]) -> tuple[list[str], str | None]:
    """(the files to fetch, the GGUF file to load or None for the folder)."""
    models = gguf_models(files)
    safetensors = [name for name in files if "/" not in name and name.endswith(".safetensors")]
    if (hub_id.quantization is None and safetensors) or not models:
        if not safetensors:
            raise ModelLoadError(f"{hub_id.repo} holds neither safetensors weights nor GGUF files rsgl can load (it has: {_listing(files)}).")
        return [name for name in files if name in FOLDER_FILES] + _weights_of_folder(safetensors), None
    quantization = _pick_quantization(hub_id, models)
    shards = models[quantization]
    projector = projector_of(files)
    return shards + ([projector] if projector else []), shards[0]


def projector_of(files: list[str]) -> str | None:
    """The projector file (llama.cpp's `mmproj-*.gguf`, beside the models) a GGUF repo's model comes with, if it has
    any (see PROJECTOR_PREFERENCE); the engine finds it beside the model file."""
    projectors = sorted(name for name in files if "/" not in name and name.lower().endswith(".gguf") and "mmproj" in name.lower())
    tagged = [(name, f"-{PurePosixPath(name).stem.upper().replace('.', '-')}-") for name in projectors]
    preferred = (name for tag in PROJECTOR_PREFERENCE for name, stem in tagged if f"-{tag}-" in stem or f"_{tag}-" in stem)
    return next(preferred, projectors[0] if projectors else None)


def _weights_of_folder(safetensors: list[str]) -> list[str]:
    """A folder's weight files, without Mistral's `consolidated` copy of the same weights."""
    return [name for name in safetensors if not name.startswith("consolidated")] or safetensors


def gguf_models(files: list[str]) -> dict[str, list[str]]:
    """A GGUF repo's models by quantization name (upper case), each its file or its shards in
    order; projector files (`mmproj`) are not models."""
    models: dict[str, list[str]] = {}
    for name in sorted(files):
        path = PurePosixPath(name)
        if path.suffix.lower() != ".gguf" or "mmproj" in path.name.lower():
            continue
        stem = _SHARD.sub("", path.stem)
        match = _QUANTIZATION.search(stem)
        models.setdefault(match["name"].upper() if match else stem, []).append(name)
    return models


def _pick_quantization(hub_id: HubId, models: dict[str, list[str]]) -> str:
    available = ", ".join(sorted(models))
    if hub_id.quantization is not None:
        wanted = hub_id.quantization.upper()
        if wanted not in models:
            raise ModelLoadError(f"{hub_id.repo} has no {hub_id.quantization} GGUF file; it has: {available}. Name one after a colon: {hub_id.repo}:QUANT.")
        return wanted
    for preferred in DEFAULT_QUANTIZATIONS:
        if preferred in models:
            return preferred
    if len(models) == 1:
        return next(iter(models))
    preferred = ", ".join(DEFAULT_QUANTIZATIONS)
    raise ModelLoadError(f"{hub_id.repo} holds several GGUF models ({available}) and none of {preferred}; name one: {hub_id.repo}:QUANT.")


def _listing(files: list[str]) -> str:
    return ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "") if files else "no files"


def _download(hub_id: HubId, revision: str, files: list[str]) -> Path:
    from huggingface_hub import snapshot_download

    folder = snapshot_download(hub_id.repo, revision=revision, allow_patterns=files, cache_dir=hub_cache_dir())
    return Path(str(folder))
