"""`@rsgl.function`: a program, run once (`run`), on many inputs in parallel (`run_batch`), or
streamed."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from rsgl.engine import Engine
from rsgl.lang.backends import Backend, as_backend
from rsgl.lang.state import ProgramState

# Programs of a batch in flight at once: enough for the engine to batch their requests.
DEFAULT_BATCH_THREADS = 32


class Program:
    """A function `f(s, **arguments)` that builds its text on the state `s`."""

    def __init__(self, body: Callable[..., None]) -> None:
        self.body = body
        functools.update_wrapper(self, body)

    def run(self, *args: Any, backend: Backend | Engine | None = None, stream: bool = False, **kwargs: Any) -> ProgramState:
        """Runs the program and returns its state. With `stream=True` it runs in the background
        and returns at once: `state.text_iter(name)` yields a variable as it is generated."""
        state = ProgramState(as_backend(backend), stream=stream)
        if stream:
            threading.Thread(target=self._execute, args=(state, args, kwargs), name="rsgl-program", daemon=True).start()
        else:
            self._execute(state, args, kwargs)
            state.sync()
        return state

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        backend: Backend | Engine | None = None,
        num_threads: int | None = None,
        progress_bar: bool = False,
    ) -> list[ProgramState]:
        """Runs the program on each argument dict, `num_threads` at a time, so the engine batches
        their requests; returns the states in order (a failed program's state raises on reading)."""
        resolved = as_backend(backend)
        threads = num_threads or min(DEFAULT_BATCH_THREADS, max(1, len(batch_kwargs)))
        with ThreadPoolExecutor(max_workers=threads) as pool, tqdm(total=len(batch_kwargs), disable=not progress_bar, desc=self.body.__name__) as bar:

            def one(kwargs: dict[str, Any]) -> ProgramState:
                state = ProgramState(resolved)
                self._execute(state, (), kwargs)
                bar.update(1)
                return state

            return list(pool.map(one, batch_kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    def _execute(self, state: ProgramState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self.body(state, *args, **kwargs)
        except BaseException as error:  # kept for whoever reads the state
            state._finish(error)
        else:
            state._finish()


def function(body: Callable[..., None]) -> Program:
    """Makes `body(s, ...)` a program: `program.run(...)`, `program.run_batch([...])`."""
    return Program(body)
