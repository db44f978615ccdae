"""The exceptions rsgl raises, from Python and from the Rust core (which imports this module).

Catch `RsglError` for anything rsgl-specific. Messages say what went wrong and what to do about it.
"""


class RsglError(Exception):
    """Base class of every rsgl error."""


class ModelLoadError(RsglError):
    """The model files are missing, corrupt or unreadable."""


class UnsupportedModelError(ModelLoadError):
    """The files are readable, but use an architecture, tensor type or tokenizer rsgl does not run."""


class InvalidRequestError(RsglError, ValueError):
    """A bad argument: sampling parameters, a prompt that is too long, malformed messages..."""


class EngineClosedError(RsglError):
    """The engine was shut down; create a new one to keep generating."""
