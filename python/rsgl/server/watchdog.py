"""Two guards for a server that must never hang: a thread that notices the event loop blocked for too
long and logs every thread's stack (so a stuck server explains itself), and a deadline that ends
the process if a stop signal did not within its shutdown time."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import sys
import threading
import time

logger = logging.getLogger("rsgl.server")
# How often the event loop proves it is alive.
HEARTBEAT_SECONDS = 0.5


class LoopWatchdog:
    """Logs every thread's stack once the event loop has not run a callback for `stall_seconds`
    (once per stall)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stall_seconds: float) -> None:
        self._loop = loop
        self._stall_seconds = stall_seconds
        self._last_beat = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rsgl-watchdog", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _beat(self) -> None:
        self._last_beat = time.monotonic()
        if not self._stopped.is_set():
            self._loop.call_later(HEARTBEAT_SECONDS, self._beat)

    def _watch(self) -> None:
        reported = False
        while not self._stopped.wait(HEARTBEAT_SECONDS):
            # How late the next beat is: a running loop beats every HEARTBEAT_SECONDS.
            stalled = time.monotonic() - self._last_beat - HEARTBEAT_SECONDS
            if stalled > self._stall_seconds and not reported:
                logger.error("the event loop has been blocked for %.1f s; the stacks of every thread follow", stalled)
                dump_stacks()
            reported = stalled > self._stall_seconds


def dump_stacks() -> None:
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def exit_after(seconds: float) -> None:
    """Ends the process `seconds` from now unless it has ended by then, whatever its threads are
    doing: a shutdown that hangs logs the stacks and exits with status 1."""

    def force_exit() -> None:
        logger.error("shutdown did not finish within %.1f s; the stacks of every thread follow, then the process exits", seconds)
        dump_stacks()
        os._exit(1)

    timer = threading.Timer(seconds, force_exit)
    timer.daemon = True
    timer.start()
