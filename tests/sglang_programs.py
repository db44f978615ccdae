"""SGLang's documented example programs (few-shot, multi-turn chat, fork, select, regex, JSON,
batch), written as its docs write them with budgets cut to keep the tests short, for either
frontend: `define_programs(sglang)` or `define_programs(rsgl)` (what `import rsgl as sgl` runs)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pydantic

IP_REGEX = r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
CHARACTER_REGEX = (
    r"""\{\n"""
    + r"""    "name": "[\w\d\s]{1,16}",\n"""
    + r"""    "house": "(Gryffindor|Slytherin|Ravenclaw|Hufflepuff)",\n"""
    + r"""    "blood status": "(Pure-blood|Half-blood|Muggle-born)",\n"""
    + r"""    "wand": \{\n"""
    + r"""        "wood": "[\w\d\s]{1,16}",\n"""
    + r"""        "length": [0-9]{1,2}\.[0-9]{0,2}\n"""
    + r"""    \},\n"""
    + r"""    "alive": "(Alive|Deceased)"\n"""
    + r"""\}"""
)
TOOLS = ["calculator", "search engine"]
CITIES = [" London", " Paris", " a banana"]
QUESTIONS = ["What is the capital of the United Kingdom?", "What is the capital of France?", "What is the capital of Japan?"]


class CapitalInfo(pydantic.BaseModel):
    """SGLang's JSON decoding example: the schema comes from a pydantic model. Extra properties
    are forbidden so the document fits the token budget: with them allowed, the default model
    goes on adding properties past it on some ISAs' greedy path, and the cut JSON is invalid."""

    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=20)
    population: int = pydantic.Field(ge=0, le=99999999)


CAPITAL_SCHEMA = CapitalInfo.model_json_schema()


def define_programs(sgl: Any) -> SimpleNamespace:
    """SGLang's documented example programs, written as its docs write them (budgets cut to keep
    the tests short), for the frontend module `sgl`: `sglang` itself or `rsgl`."""

    @sgl.function
    def few_shot_qa(s, question):
        s += """The following are questions with answers.
Q: What is the capital of France?
A: Paris
Q: What is the capital of Germany?
A: Berlin
Q: What is the capital of Italy?
A: Rome
"""
        s += "Q: " + question + "\n"
        s += "A:" + sgl.gen("answer", stop="\n", temperature=0)

    @sgl.function
    def multi_turn_question(s, question_1, question_2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question_1)
        s += sgl.assistant(sgl.gen("answer_1", max_tokens=24))
        s += sgl.user(question_2)
        s += sgl.assistant(sgl.gen("answer_2", max_tokens=24))

    @sgl.function
    def tip_suggestion(s):
        s += "Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.\n\n"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Now, expand tip {i + 1} into a paragraph:\n"
            f += sgl.gen("detailed_tip", max_tokens=16, stop="\n\n")
        s += "Tip 1:" + forks[0]["detailed_tip"] + "\n"
        s += "Tip 2:" + forks[1]["detailed_tip"] + "\n"
        s += "In summary" + sgl.gen("summary", max_tokens=8)

    @sgl.function
    def tool_use(s, question):
        s += "To answer this question: " + question + ". "
        s += "I need to use a " + sgl.gen("tool", choices=TOOLS) + ". "
        if s["tool"] == "calculator":
            s += "The math expression is" + sgl.gen("expression", max_tokens=8)
        elif s["tool"] == "search engine":
            s += "The key word to search is" + sgl.gen("word", max_tokens=8)

    @sgl.function
    def capital(s):
        s += "The capital of France is"
        s += sgl.select("city", choices=CITIES)

    @sgl.function
    def regular_expression_gen(s):
        s += "Q: What is the IP address of the Google DNS servers?\n"
        s += "A: " + sgl.gen("answer", temperature=0, regex=IP_REGEX)

    @sgl.function
    def character_gen(s, name):
        s += name + " is a character in Harry Potter. Please fill in the following information about this character.\n"
        s += sgl.gen("json_output", max_tokens=160, regex=CHARACTER_REGEX)

    @sgl.function
    def json_decode(s, country):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user("Describe the capital of " + country + " as JSON.")
        s += sgl.assistant(sgl.gen("json_output", max_tokens=48, json_schema=json.dumps(CAPITAL_SCHEMA)))

    @sgl.function
    def text_qa(s, question):
        s += "Q: " + question + "\n"
        s += "A:" + sgl.gen("answer", stop="\n", max_tokens=16)

    return SimpleNamespace(
        few_shot_qa=few_shot_qa,
        multi_turn_question=multi_turn_question,
        tip_suggestion=tip_suggestion,
        tool_use=tool_use,
        capital=capital,
        regular_expression_gen=regular_expression_gen,
        character_gen=character_gen,
        json_decode=json_decode,
        text_qa=text_qa,
    )
