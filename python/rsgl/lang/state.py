"""A running program's state: its text, its variables, and the forks it branches into."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rsgl._typing import JsonObject
from rsgl.errors import InvalidRequestError
from rsgl.lang.backends import Backend
from rsgl.lang.expressions import Concat, Expression, Gen, Role, Select

# The key under which the whole text streams, beside the variables.
WHOLE_TEXT = None


class ProgramState:
    """`s += "text"` appends text; `s += gen(...)` / `select(...)` run on the backend at once with
    the text so far as the prompt; `s[name]` reads a variable; `s.fork(n)` branches.
    `default_sampling_params` apply to every `gen` that leaves them unset."""

    def __init__(self, backend: Backend, stream: bool = False, default_sampling_params: JsonObject | None = None) -> None:
        self.backend = backend
        self.stream = stream
        self.default_sampling_params = default_sampling_params or {}
        self._text = ""
        self._variables: dict[str, Any] = {}
        self._meta: dict[str, JsonObject] = {}
        self._messages: list[JsonObject] = []
        # Streaming: the pieces each variable (and the whole text) has received so far, and which are complete.
        self._changed = threading.Condition()
        self._partial: dict[str | None, list[str]] = {}
        self._complete: set[str] = set()
        self._finished = False
        self._error: BaseException | None = None
        # The thread running the program: it reads its own state without waiting for the end.
        self._program_thread: int | None = None

    # ---- building the program's text ------------------------------------------------------------

    def __iadd__(self, expression: Expression) -> ProgramState:
        if isinstance(expression, str):
            self._append(expression)
        elif isinstance(expression, Concat):
            for part in expression.parts:
                self += part
        elif isinstance(expression, Gen):
            self._gen(expression)
        elif isinstance(expression, Select):
            self._select(expression)
        elif isinstance(expression, Role):
            with self._role(expression.role):
                for part in expression.content:
                    self += part
        else:
            raise InvalidRequestError(f"a program state takes text, gen, select or a role block, not {type(expression).__name__}")
        return self

    def system(self) -> contextlib.AbstractContextManager[None]:
        """`with s.system(): s += ...` is `s += system(...)`."""
        return self._role("system")

    def user(self) -> contextlib.AbstractContextManager[None]:
        return self._role("user")

    def assistant(self) -> contextlib.AbstractContextManager[None]:
        return self._role("assistant")

    @contextlib.contextmanager
    def _role(self, role: str) -> Iterator[None]:
        before, after = self.backend.role_markers(role)
        self._append(before)
        start = len(self._text)
        yield
        self._messages.append({"role": role, "content": self._text[start:]})
        self._append(after)

    def _append(self, text: str) -> None:
        self._text += text
        self._publish(WHOLE_TEXT, text, complete=False)

    def _gen(self, expression: Gen) -> None:
        name = expression.name
        params = {**self.default_sampling_params, **expression.sampling_params}
        if self.stream:
            value = self._streamed_gen(name, params)
        else:
            result = self.backend.generate(self._text, params)
            value = result["text"]
            if name is not None:
                self._meta[name] = result["meta_info"]
            self._append(value)
        if name is not None:
            self._set(name, value, published=self.stream)

    def _streamed_gen(self, name: str | None, params: JsonObject) -> str:
        """Generates, each piece published to the whole text (and variable `name`) as it comes."""
        pieces = []
        for piece in self.backend.generate_stream(self._text, params):
            pieces.append(piece)
            self._publish(WHOLE_TEXT, piece, complete=False)
            if name is not None:
                self._publish(name, piece, complete=False)
        value = "".join(pieces)
        self._text += value  # published piece by piece
        return value

    def _select(self, expression: Select) -> None:
        result = self.backend.select(self._text, list(expression.choices))
        self._append(result["text"])
        if expression.name is not None:
            self._meta[expression.name] = result
            self._set(expression.name, result["text"])

    def _set(self, name: str, value: Any, published: bool = False) -> None:
        """Sets variable `name`; unless its text was `published` piece by piece, it streams whole."""
        self._variables[name] = value
        self._publish(name, value if isinstance(value, str) and not published else "", complete=True)

    # ---- reading ----------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        self.sync()
        return self._variables[name]

    def text(self) -> str:
        """The whole text: the program's own and everything generated."""
        self.sync()
        return self._text

    def get_meta_info(self, name: str) -> JsonObject:
        """The backend's meta_info of the `gen` that set `name` (token counts, finish reason...),
        or the choice scores of a `select`."""
        self.sync()
        return self._meta[name]

    def variables(self) -> dict[str, Any]:
        self.sync()
        return dict(self._variables)

    def messages(self) -> list[JsonObject]:
        """The role blocks so far, as chat messages: [{"role": "user", "content": ...}, ...]."""
        self.sync()
        return [dict(message) for message in self._messages]

    # ---- branching --------------------------------------------------------------------------------

    def fork(self, n: int) -> ForkGroup:
        """`n` copies of this state that continue on their own (in parallel when appended to as a
        group: `forks += gen(...)`); `forks.join()` gathers their variables back."""
        if not isinstance(n, int) or n < 1:
            raise InvalidRequestError("fork takes a positive number of branches")
        branches = []
        for _ in range(n):
            branch = ProgramState(self.backend, default_sampling_params=self.default_sampling_params)
            branch._text = self._text
            branch._variables = dict(self._variables)
            branch._messages = list(self._messages)
            branches.append(branch)
        return ForkGroup(self, branches)

    # ---- streaming --------------------------------------------------------------------------------

    def text_iter(self, name: str | None = None) -> Iterator[str]:
        """The pieces of variable `name` as they are generated (with `run(..., stream=True)`); with
        no name, of the whole text."""
        sent = 0  # pieces
        while True:
            with self._changed:
                self._changed.wait_for(functools.partial(self._has_news, name, sent))
                pieces, complete, finished = self._partial.get(name, [])[sent:], name in self._complete, self._finished
            sent += len(pieces)
            if text := "".join(pieces):
                yield text
            elif complete or finished:
                if self._error is not None:
                    raise self._error
                return

    def _has_news(self, name: str | None, sent: int) -> bool:
        """Whether variable `name` has received more than `sent` pieces, completed, or the program ended."""
        return len(self._partial.get(name, [])) > sent or name in self._complete or self._finished

    def sync(self) -> None:
        """Waits for a streamed program to finish; raises the error it failed with, if any. The
        program itself reads its state as it is (`if s["tool"] == ...`)."""
        if threading.get_ident() == self._program_thread:
            return
        with self._changed:
            self._changed.wait_for(lambda: self._finished)
        if self._error is not None:
            raise self._error

    def _publish(self, name: str | None, piece: str, complete: bool) -> None:
        with self._changed:
            self._partial.setdefault(name, []).append(piece)
            if complete and name is not None:
                self._complete.add(name)
            self._changed.notify_all()

    def _begin(self) -> None:
        self._program_thread = threading.get_ident()

    def _finish(self, error: BaseException | None = None) -> None:
        with self._changed:
            self._program_thread = None
            self._error = error
            self._finished = True
            self._changed.notify_all()


class ForkGroup:
    """The branches of `s.fork(n)`: index or iterate them, append to all of them at once, and
    `join()` them back into the parent."""

    def __init__(self, parent: ProgramState, branches: list[ProgramState]) -> None:
        self.parent = parent
        self.branches = branches
        for branch in branches:
            branch._finish()  # a branch runs inside its parent's program: readable at once

    def __iadd__(self, expression: Expression) -> ForkGroup:
        """Appends `expression` to every branch, the branches running in parallel (so the engine
        batches their requests; they share the parent's prefix in the radix cache)."""
        with ThreadPoolExecutor(max_workers=len(self.branches)) as pool:
            list(pool.map(lambda branch: branch.__iadd__(expression), self.branches))
        return self

    def __getitem__(self, index: int) -> ProgramState:
        return self.branches[index]

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.branches)

    def __len__(self) -> int:
        return len(self.branches)

    def join(self) -> list[dict[str, Any]]:
        """Gathers the branches back: each variable a branch set (or changed) becomes, in the
        parent, the list of its value in every branch (SGLang's "gather_variable" join). Returns
        each branch's variables."""
        parent = self.parent._variables
        for name in dict.fromkeys(name for branch in self.branches for name in branch._variables):
            values = [branch._variables.get(name) for branch in self.branches]
            # Variables inherited from the parent and left alone stay as they are.
            if any(value is not parent.get(name) for value in values):
                parent[name] = values
        return [dict(branch._variables) for branch in self.branches]
