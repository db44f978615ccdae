"""The engine's options have one source, the Rust `EngineOptions`: the files scripts/gen_options.py
writes from it are current, and what they say reaches the places that use them (rsgl.Engine's
keyword arguments, the server's flags)."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
from rsgl import _core, engine_options
from rsgl.engine import Engine
from rsgl.server.__main__ import engine_options as server_engine_options
from rsgl.server.__main__ import parse_args

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_options.py"


@pytest.fixture(scope="module")
def gen_options():
    spec = importlib.util.spec_from_file_location("gen_options", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_options"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_current(gen_options):
    stale = [str(path) for path, text in gen_options.generated_files().items() if path.read_text() != text]
    assert not stale, f"run `python scripts/gen_options.py`: {stale} differ from what the engine's options generate"


def test_every_engine_option_is_typed_defaulted_and_a_flag():
    properties = _core.engine_options_schema()["properties"]
    assert list(engine_options.EngineOptions.__optional_keys__) and set(engine_options.EngineOptions.__optional_keys__) == set(properties)
    assert engine_options.DEFAULTS == {name: prop["default"] for name, prop in properties.items()}
    assert set(engine_options.SERVER_FLAGS) == {"--" + name.replace("_", "-") for name in properties}


def test_engine_takes_each_option_once_by_keyword(gen_options):
    """rsgl.Engine's own keyword parameters are the options it resolves; the rest come through
    `**options` typed by `EngineKeywords`, so none is taken twice or left out."""
    parameters = inspect.signature(Engine).parameters
    properties = set(_core.engine_options_schema()["properties"])
    assert properties & set(parameters) == set(gen_options.RESOLVED_BY_ENGINE)
    assert set(engine_options.EngineKeywords.__optional_keys__) == properties - set(gen_options.RESOLVED_BY_ENGINE)


def test_server_flags_reach_the_engine_under_the_option_names():
    args = parse_args(["--hicache-size-gb", "2.5", "--schedule-policy", "lpm", "--no-pin-threads", "--tp", "2", "--disable-radix-cache"])
    options = server_engine_options(args)
    assert options == {"hicache_size_gb": 2.5, "schedule_policy": "lpm", "pin_threads": False, "tp_size": 2, "disable_radix_cache": True}
    assert server_engine_options(parse_args([])) == {}
    with pytest.raises(SystemExit):
        parse_args(["--schedule-policy", "random"])  # an enum's flag takes only its values


def test_engine_refuses_an_unknown_option_before_loading():
    with pytest.raises(TypeError, match="not_an_option"):
        Engine("/nonexistent", not_an_option=1)  # type: ignore[call-arg]
