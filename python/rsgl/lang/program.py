"""`@rsgl.function`: a program, run once (`run`), on many inputs in parallel (`run_batch`), or
streamed."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, cast

from tqdm import tqdm

from rsgl._typing import JsonObject
from rsgl.engine import Engine
from rsgl.lang.backends import Backend, as_backend
from rsgl.lang.state import ProgramState

# Programs of a batch in flight at once: enough for the engine to batch their requests.
DEFAULT_BATCH_THREADS = 32
# Keyword arguments of `run` and `run_batch` that set every `gen`'s default instead of reaching the
# program (as in SGLang, where a program cannot take arguments of these names).
SAMPLING_DEFAULTS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
)


class Program:
    """A function `f(s, **arguments)` that builds its text on the state `s`."""

    def __init__(self, body: Callable[..., None]) -> None:
        self.body = body
        functools.update_wrapper(self, body)

    def run(self, *args: Any, backend: Backend | Engine | None = None, stream: bool = False, **kwargs: Any) -> ProgramState:
        """Runs the program and returns its state. With `stream=True` it runs in the background
        and returns at once: `state.text_iter(name)` yields a variable as it is generated. The
        keyword arguments named in SAMPLING_DEFAULTS (`temperature=0`...) are defaults for every
        `gen`; the others go to the program."""
        state = ProgramState(as_backend(backend), stream=stream, default_sampling_params=take_sampling_defaults(kwargs))
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
        num_threads: int | Literal["auto"] | None = None,
        progress_bar: bool = False,
        **sampling_defaults: Any,
    ) -> list[ProgramState]:
        """Runs the program on each argument dict, `num_threads` at a time ("auto" or None: up to
        DEFAULT_BATCH_THREADS), so the engine batches their requests; returns the states in order
        (a failed program's state raises on reading). `sampling_defaults` are as in `run`."""
        resolved = as_backend(backend)
        defaults = take_sampling_defaults(sampling_defaults)
        if sampling_defaults:
            raise TypeError(f"run_batch() got unexpected keyword arguments: {', '.join(sorted(sampling_defaults))}")
        auto = min(DEFAULT_BATCH_THREADS, max(1, len(batch_kwargs)))
        threads = auto if num_threads in (None, "auto") else cast(int, num_threads)
        with ThreadPoolExecutor(max_workers=threads) as pool, tqdm(total=len(batch_kwargs), disable=not progress_bar, desc=self.body.__name__) as bar:

            def one(kwargs: dict[str, Any]) -> ProgramState:
                state = ProgramState(resolved, default_sampling_params=defaults)
                self._execute(state, (), kwargs)
                bar.update(1)
                return state

            return list(pool.map(one, batch_kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    def _execute(self, state: ProgramState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        state._begin()
        try:
            self.body(state, *args, **kwargs)
        except BaseException as error:  # kept for whoever reads the state
            state._finish(error)
        else:
            state._finish()


def take_sampling_defaults(kwargs: dict[str, Any]) -> JsonObject:
    """Removes the SAMPLING_DEFAULTS from `kwargs`; returns those that are set."""
    taken = {name: kwargs.pop(name) for name in SAMPLING_DEFAULTS if name in kwargs}
    return {name: value for name, value in taken.items() if value is not None}


def function(body: Callable[..., None]) -> Program:
    """Makes `body(s, ...)` a program: `program.run(...)`, `program.run_batch([...])`."""
    return Program(body)
