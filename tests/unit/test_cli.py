"""The `rsgl` command (run as `python -m rsgl.cli`: the console script may not be installed)."""

from __future__ import annotations

import subprocess
import sys


def rsgl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rsgl.cli", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_the_commands():
    for args in (("--help",), ()):
        result = rsgl(*args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: rsgl ")
        for command in ("serve", "bench", "quantize", "pull", "models"):
            assert f"    {command} " in result.stdout


def test_serve_help_is_the_server_s():
    result = rsgl("serve", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: rsgl serve ")
    for option in ("--model-path", "--port", "--log-requests", "--kv-cache-dtype"):
        assert option in result.stdout


def test_unknown_command_is_an_error_naming_the_commands():
    result = rsgl("serv")
    assert result.returncode == 2
    assert "invalid choice: 'serv'" in result.stderr and "quantize" in result.stderr
