"""`rsgl pull` and `rsgl models`: the Hugging Face cache, from the command line."""

from __future__ import annotations

import argparse
import sys

from rsgl.errors import ModelLoadError
from rsgl.loader import hub


def pull(argv: list[str] | None = None, prog: str = "rsgl pull") -> None:
    """Fetch a model into the Hugging Face cache without serving it, and print its local path."""
    parser = argparse.ArgumentParser(prog=prog, description=pull.__doc__)
    parser.add_argument("model", metavar="ORG/NAME[:QUANT]", help="a Hugging Face Hub id; a quantization after a colon picks one GGUF file of the repo")
    parser.add_argument("--revision", help="the branch, tag or commit (default: main)")
    args = parser.parse_args(argv)
    hub_id = hub.parse_hub_id(args.model)
    if hub_id is None:
        parser.error(f"{args.model!r} is not a Hugging Face Hub id (org/name or org/name:QUANT)")
    try:
        path = hub.resolve(hub_id, args.revision)
    except ModelLoadError as error:
        sys.exit(f"{prog}: {error}")
    print(path)


def models(argv: list[str] | None = None, prog: str = "rsgl models") -> None:
    """List the models the Hugging Face cache holds, with their sizes and what rsgl would load."""
    from huggingface_hub import scan_cache_dir

    parser = argparse.ArgumentParser(prog=prog, description=models.__doc__)
    parser.parse_args(argv)
    cache = hub.hub_cache_dir()
    repos = sorted((repo for repo in scan_cache_dir(cache).repos if repo.repo_type == "model"), key=lambda repo: repo.repo_id) if cache.is_dir() else []
    if not repos:
        print(f"the Hugging Face cache ({cache}) holds no models; fetch one with: rsgl pull ORG/NAME")
        return
    rows = [("MODEL", "SIZE", "REVISIONS", "HOLDS")]
    for repo in repos:
        files = sorted({file.file_name for revision in repo.revisions for file in revision.files})
        ggufs = hub.gguf_models(files)
        safetensors = any(name.endswith(".safetensors") for name in files)
        holds = ", ".join(f"{repo.repo_id}:{name}" for name in ggufs) if ggufs else "safetensors" if safetensors else "no weights"
        refs = ", ".join(sorted({ref for revision in repo.revisions for ref in revision.refs})) or "(commits only)"
        rows.append((repo.repo_id, repo.size_on_disk_str, refs, holds))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    print(f"(cache: {cache})")
