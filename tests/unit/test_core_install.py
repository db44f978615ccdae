"""The core install serves: rsgl loads the default model (a GGUF file: its tokenizer built by the core) and
answers with torch, transformers, tokenizers and gguf unimportable, as on `pip install rsgl` alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

NOT_IN_THE_CORE_INSTALL = ("torch", "transformers", "tokenizers", "gguf")


def test_the_default_model_answers_without_the_test_and_bench_packages():
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {NOT_IN_THE_CORE_INSTALL!r}:
                    raise ImportError(f"{{name}} is not in the core install")
                return None

        sys.meta_path.insert(0, Refuse())
        import rsgl

        with rsgl.Engine(threads=1, progress=False) as engine:
            out = engine.generate("The capital of France is", {{"temperature": 0, "max_new_tokens": 4}})
        print(engine.model.source)
        print(repr(out["text"]))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    source, text = done.stdout.strip().splitlines()[-2:]
    assert source.endswith(".gguf"), source
    assert text.strip("'\"") != "", text
