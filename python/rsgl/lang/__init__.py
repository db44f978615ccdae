"""`rsgl.lang`: LLM programs in plain Python, in the spirit of SGLang's frontend.

    import rsgl

    @rsgl.function
    def qa(s, question):
        s += rsgl.user(question)
        s += rsgl.assistant(rsgl.gen("answer", max_tokens=64, temperature=0))

    rsgl.set_default_backend(rsgl.Engine())          # or rsgl.RuntimeEndpoint("http://127.0.0.1:30000")
    state = qa.run(question="What is the capital of France?")
    print(state["answer"])

A program appends text and generation calls to its state `s`; each `gen` or `select` runs when it
is appended, on the program's backend, with the whole text so far as its prompt, so programs
sharing a prefix (few-shot examples, a conversation, a fork) reuse its KV through the radix cache
without being told.
"""

from rsgl.lang.backends import Backend, EngineBackend, RuntimeEndpoint, set_default_backend
from rsgl.lang.expressions import assistant, gen, select, system, user
from rsgl.lang.program import Program, function
from rsgl.lang.state import ForkGroup, ProgramState

__all__ = [
    "Backend",
    "EngineBackend",
    "ForkGroup",
    "Program",
    "ProgramState",
    "RuntimeEndpoint",
    "assistant",
    "function",
    "gen",
    "select",
    "set_default_backend",
    "system",
    "user",
]
