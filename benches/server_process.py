"""A server under benchmark, in a process of its own on loopback: rsgl's (`python -m rsgl.server`) or
llama.cpp's llama-server, started with the arguments given, ready when /health answers, with its load
time (start to healthy) and peak RSS (VmHWM) for the report. The benches that compare the two servers
share it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

LLAMA_CPP_BIN = Path("/var/tmp/llama.cpp-build/build/bin")
LLAMA_CPP_BUILD = """llama.cpp is not built at {bin}. Build it (outside the clone) from llama-cpp-python's sdist:
    mkdir -p /var/tmp/llama.cpp-build && cd /var/tmp/llama.cpp-build
    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d . && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF
    cmake --build build -j2 --target llama-mtmd-cli llama-server
or pass --llama-cpp-bin, or --skip-llama-cpp."""
START_TIMEOUT_SECONDS = 600


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServerProcess:
    """`command` (given its port by `port_arguments`) running until `stop`, its output in a temporary log."""

    def __init__(self, name: str, command: list[str]):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
        started = time.perf_counter()
        self.process = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT)
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited ({self.process.returncode}); its log: {self.log.name}")
            if time.perf_counter() - started > START_TIMEOUT_SECONDS:
                raise RuntimeError(f"{name} did not start in {START_TIMEOUT_SECONDS} s; its log: {self.log.name}")
            time.sleep(0.05)
        self.load_seconds = time.perf_counter() - started

    @classmethod
    def llama_server(cls, binaries: Path, model: Path, threads: int, *arguments: str) -> ServerProcess:
        return cls("llama-server", [str(binaries / "llama-server"), "-m", str(model), "-t", str(threads), "-tb", str(threads), *arguments])

    @classmethod
    def rsgl(cls, model: Path, threads: int, *arguments: str) -> ServerProcess:
        return cls("rsgl", [sys.executable, "-m", "rsgl.server", "--model-path", str(model), "--threads", str(threads), *arguments])

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def peak_rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.unlink(self.log.name)
