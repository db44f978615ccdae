"""A Hugging Face Hub on loopback: the part of its HTTP API `huggingface_hub` downloads through
(repo info, file tree, resolve), serving repos from local folders, so the real library fills a real
cache (HF_ENDPOINT points it here)."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class LocalHub:
    """Repos by id, each {revision name or commit: folder}; `gated` repos answer 403 as the Hub does without a token."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, tuple[str, Path]]] = {}
        self.gated: set[str] = set()
        self.downloads: list[str] = []

    def add(self, repo: str, folder: Path, revisions: tuple[str, ...] = ("main",)) -> str:
        commit = hashlib.sha1(f"{repo}@{folder}".encode()).hexdigest()
        for revision in (*revisions, commit):
            self.repos.setdefault(repo, {})[revision] = (commit, folder)
        return commit

    def _find(self, request: Request) -> tuple[str, str, Path] | Response:
        repo = f"{request.path_params['org']}/{request.path_params['name']}"
        if repo not in self.repos:
            return _error(404, "RepoNotFound", f"Repository {repo} not found")
        if repo in self.gated and not request.headers.get("authorization"):
            return _error(403, "GatedRepo", f"Access to model {repo} is restricted")
        revision = request.path_params["revision"]
        if revision not in self.repos[repo]:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        commit, folder = self.repos[repo][revision]
        return repo, commit, folder

    async def info(self, request: Request) -> Response:
        found = self._find(request)
        if isinstance(found, Response):
            return found
        repo, commit, folder = found
        return JSONResponse({"id": repo, "modelId": repo, "sha": commit, "private": False, "siblings": [{"rfilename": f} for f in _files(folder)]})

    async def tree(self, request: Request) -> Response:
        found = self._find(request)
        if isinstance(found, Response):
            return found
        _, _, folder = found
        entries = [{"type": "file", "path": f, "size": (folder / f).stat().st_size, "oid": _oid(folder / f)} for f in _files(folder)]
        return JSONResponse(entries)

    async def resolve(self, request: Request) -> Response:
        found = self._find(request)
        if isinstance(found, Response):
            return found
        _, commit, folder = found
        path = folder / request.path_params["path"]
        if not path.is_file():
            return _error(404, "EntryNotFound", f"{request.path_params['path']} does not exist")
        body = path.read_bytes()
        headers = {"X-Repo-Commit": commit, "ETag": f'"{_oid(path)}"', "Content-Length": str(len(body))}
        if request.method == "HEAD":
            return Response(b"", headers=headers)
        self.downloads.append(request.path_params["path"])
        return Response(body, headers=headers, media_type="application/octet-stream")

    def app(self) -> Starlette:
        repo = "/{org}/{name}"
        return Starlette(
            routes=[
                Route(f"/api/models{repo}/revision/{{revision}}", self.info),
                Route(f"/api/models{repo}/tree/{{revision}}", self.tree),
                Route(f"{repo}/resolve/{{revision}}/{{path:path}}", self.resolve, methods=["GET", "HEAD"]),
            ]
        )


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers={"X-Error-Code": code, "X-Error-Message": message})


@contextlib.contextmanager
def serving(hub: LocalHub) -> Iterator[str]:
    """The hub's URL while it serves on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(hub.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()
