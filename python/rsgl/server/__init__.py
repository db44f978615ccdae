"""rsgl's HTTP server: OpenAI-compatible and SGLang-native endpoints over an `rsgl.Engine`.

    python -m rsgl.server --port 30000          # the default model

or, in-process:

    app = rsgl.server.build_app(rsgl.Engine(), api_key="secret")   # a Starlette app, e.g. for uvicorn
"""

from rsgl.server.app import build_app

__all__ = ["build_app"]
