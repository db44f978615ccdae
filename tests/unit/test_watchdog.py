"""The server's guards against hanging: a blocked event loop gets every thread's stack logged, and a
shutdown that hangs ends the process anyway."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time

from rsgl.server.watchdog import LoopWatchdog


def block_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)


def test_a_blocked_event_loop_has_every_threads_stack_logged(capfd, caplog):
    async def run(blocked_seconds: float) -> None:
        watchdog = LoopWatchdog(asyncio.get_running_loop(), stall_seconds=0.3)
        watchdog.start()
        await asyncio.sleep(0.6)  # beating: nothing to report
        block_the_loop_for(blocked_seconds)
        await asyncio.sleep(0.1)
        watchdog.stop()

    with caplog.at_level(logging.ERROR, logger="rsgl.server"):
        asyncio.run(run(blocked_seconds=1.5))
    reports = [r for r in caplog.records if "event loop has been blocked" in r.message]
    assert len(reports) == 1  # once per stall
    stacks = capfd.readouterr().err
    assert "block_the_loop_for" in stacks  # the blocked loop's own frame


def test_a_loop_that_keeps_running_is_not_reported(capfd, caplog):
    async def run() -> None:
        watchdog = LoopWatchdog(asyncio.get_running_loop(), stall_seconds=2)
        watchdog.start()
        for _ in range(25):  # several beats and checks
            await asyncio.sleep(0.1)
        watchdog.stop()

    with caplog.at_level(logging.ERROR, logger="rsgl.server"):
        asyncio.run(run())
    assert not caplog.records
    assert "Thread" not in capfd.readouterr().err


def test_a_hanging_shutdown_ends_the_process_with_the_stacks_logged():
    program = "from rsgl.server.watchdog import exit_after; import time; exit_after(0.5); time.sleep(60)"
    started = time.monotonic()
    finished = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
    assert finished.returncode == 1
    assert time.monotonic() - started < 20
    assert "shutdown did not finish" in finished.stderr
    assert 'File "<string>"' in finished.stderr  # the stack of the thread that hung
