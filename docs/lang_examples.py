"""rsgl.lang example programs: few-shot QA, a multi-turn chat, tree-of-thought with fork, and JSON
extraction with a schema. Run them on an in-process engine or on a server:

    python docs/lang_examples.py                               # rsgl.Engine() in this process
    python docs/lang_examples.py --url http://127.0.0.1:30000  # a running python -m rsgl.server

tests/server/test_lang.py runs every program here on both backends.
"""

from __future__ import annotations

import argparse
import json

import rsgl

FEW_SHOT = """Answer each question with a single word.
Q: What color is the sky on a clear day?
A: Blue
Q: What animal says meow?
A: Cat
Q: What is frozen water called?
A: Ice
"""


@rsgl.function
def few_shot_qa(s, question):
    # Every call shares the few-shot prefix: after the first, the radix cache serves it.
    s += FEW_SHOT + f"Q: {question}\nA:"
    s += rsgl.gen("answer", max_tokens=8, stop="\n", temperature=0)


@rsgl.function
def multi_turn_chat(s, questions):
    s += rsgl.system("You are a helpful assistant. Answer in one sentence.")
    for i, question in enumerate(questions):
        s += rsgl.user(question)
        s += rsgl.assistant(rsgl.gen(f"answer_{i}", max_tokens=48, temperature=0))


@rsgl.function
def tree_of_thought(s, question, branches=3):
    s += rsgl.user(question)
    forks = s.fork(branches)
    for i, branch in enumerate(forks):
        with branch.assistant():
            branch += f"Idea {i + 1}: "
            branch += rsgl.gen("idea", max_tokens=24, stop="\n", temperature=0)
    ideas = forks.join()
    s += rsgl.user("Which idea is best? " + " ".join(f"({i + 1}) {b['idea']}" for i, b in enumerate(ideas)))
    with s.assistant():
        s += "The best idea is number "
        s += rsgl.select("best", choices=[str(i + 1) for i in range(branches)])


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@rsgl.function
def extract_json(s, text):
    s += rsgl.user(f"Extract the person's name, age and city from this text as JSON.\n\n{text}")
    s += rsgl.assistant(rsgl.gen("person", max_tokens=96, json_schema=PERSON_SCHEMA, temperature=0))


def run_all(backend) -> dict:
    """Runs every example on `backend`; returns what each produced."""
    qa = few_shot_qa.run_batch([{"question": q} for q in ("What is the opposite of hot?", "What do bees make?")], backend=backend)
    chat = multi_turn_chat.run(questions=["What is the capital of France?", "And of Italy?"], backend=backend)
    thought = tree_of_thought.run(question="How could a city reduce traffic?", backend=backend)
    person = extract_json.run(text="Maria Lopez, 34, moved to Lisbon last spring.", backend=backend)
    return {
        "few_shot_qa": [state["answer"] for state in qa],
        "multi_turn_chat": [chat["answer_0"], chat["answer_1"]],
        "tree_of_thought": {"ideas": thought["idea"], "best": thought["best"]},
        "extract_json": json.loads(person["person"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server's address (default: an engine in this process)")
    parser.add_argument("--api-key", help="the server's --api-key")
    args = parser.parse_args()
    if args.url:
        print(json.dumps(run_all(rsgl.RuntimeEndpoint(args.url, api_key=args.api_key)), indent=2))
    else:
        with rsgl.Engine(progress=False) as engine:
            print(json.dumps(run_all(engine), indent=2))


if __name__ == "__main__":
    main()
