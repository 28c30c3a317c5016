"""OpenAI's Responses API through the `openai` package against a running pocketd: an answer
(the same as chat completions gives), streams (raw events and the client's stream helper),
max_output_tokens, stored responses continued by previous_response_id from the prompt cache,
GET and DELETE, function calls and their outputs, structured output with `parse()`, and
errors. Run by tests/daemon.rs; prints one line per check and exits non-zero at the first
that fails.

    python3 responses_api.py --socket PATH
"""

import argparse
import json
import pathlib
import sys

import openai
import httpx
from pydantic import BaseModel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
from openai_responses import WEATHER, unix_socket_client  # noqa: E402

QUESTION = "What is the capital of France? Answer in one word."
SYSTEM = "You are a helpful assistant. Answer briefly."


def check(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAILED ") + what, flush=True)
    if not ok:
        sys.exit(1)


def answers(client: openai.OpenAI, model: str) -> str:
    r = client.responses.create(model=model, input=QUESTION, max_output_tokens=24)
    check(r.id.startswith("resp_") and r.object == "response" and r.status == "completed", f"a response ({r.id})")
    check("Paris" in r.output_text, f"it answers: {r.output_text!r}")
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=24
    )
    check(r.output_text == chat.choices[0].message.content, "the same answer as chat completions")
    u = r.usage
    check(
        u.input_tokens == chat.usage.prompt_tokens and u.output_tokens == chat.usage.completion_tokens
        and u.total_tokens == u.input_tokens + u.output_tokens,
        f"and the same usage ({u})",
    )

    events = list(client.responses.create(model=model, input=QUESTION, max_output_tokens=24, stream=True))
    kinds = [e.type for e in events]
    check(kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed",
          f"a stream opens and completes ({kinds[:3]} … {kinds[-1]})")
    check([e.sequence_number for e in events] == list(range(len(events))), "its events are numbered in order")
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    check(streamed == done.text == r.output_text == events[-1].response.output_text,
          f"the deltas make the answer ({streamed!r})")
    with client.responses.stream(model=model, input=QUESTION, max_output_tokens=24) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    check(final.output_text == r.output_text, "the client's stream helper reads the same answer")

    cut = client.responses.create(model=model, input="Write a long poem about the sea.", max_output_tokens=3)
    check(cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
          and cut.usage.output_tokens == 3, f"max_output_tokens cuts it ({cut.status})")
    return r.output_text


def continues(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(
        model=model, instructions=SYSTEM, input="My name is Ada and I like tea.", max_output_tokens=32
    )
    follow = client.responses.create(
        model=model, instructions=SYSTEM, input="What do I like?", previous_response_id=first.id,
        max_output_tokens=24,
    )
    cached = follow.usage.input_tokens_details.cached_tokens
    check(follow.previous_response_id == first.id and follow.usage.input_tokens > first.usage.input_tokens,
          f"previous_response_id continues the conversation ({first.usage.input_tokens} → {follow.usage.input_tokens} prompt tokens)")
    check(cached > 0, f"from the prompt cache: {cached} of {follow.usage.input_tokens} prompt tokens cached")
    items = [
        {"role": "user", "content": "My name is Ada and I like tea."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What do I like?"},
    ]
    whole = client.responses.create(model=model, instructions=SYSTEM, input=items, max_output_tokens=24, store=False)
    check(whole.output_text == follow.output_text, "the same answer as the whole conversation sent as items")

    got = client.responses.retrieve(first.id)
    check(got.id == first.id and got.output_text == first.output_text, "GET returns the stored response")
    deleted = client.responses.delete(first.id)
    check(deleted is None or getattr(deleted, "deleted", True), "DELETE forgets it")
    try:
        client.responses.retrieve(first.id)
        check(False, "a deleted response is gone")
    except openai.NotFoundError:
        check(True, "a deleted response is gone (404)")
    try:
        client.responses.create(model=model, input="Hi", previous_response_id=first.id, max_output_tokens=4)
        check(False, "continuing a deleted response is refused")
    except openai.BadRequestError as e:
        check(e.body["param"] == "previous_response_id", "continuing a deleted response is a 400 naming it")
    unstored = client.responses.create(model=model, input="Hi", max_output_tokens=4, store=False)
    try:
        client.responses.retrieve(unstored.id)
        check(False, "store: false keeps nothing")
    except openai.NotFoundError:
        check(True, "store: false keeps nothing")


def calls(client: openai.OpenAI, model: str) -> None:
    asked = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = client.responses.create(model=model, input=asked, tools=[WEATHER], tool_choice="required", max_output_tokens=64)
    fcs = [o for o in r.output if o.type == "function_call"]
    check(len(fcs) >= 1 and fcs[0].name == "get_weather", f"the model calls the function ({r.output})")
    args = json.loads(fcs[0].arguments)
    check(isinstance(args, dict) and "city" in args and fcs[0].call_id, f"with its arguments ({args})")
    result = {"type": "function_call_output", "call_id": fcs[0].call_id, "output": "Sunny, 21 C"}
    by_items = client.responses.create(
        model=model, input=asked + [o.model_dump() for o in r.output] + [result], tools=[WEATHER],
        max_output_tokens=32, store=False,
    )
    check(by_items.output and by_items.output[0].type == "message" and by_items.output_text,
          f"and answers from its output ({by_items.output_text!r})")
    by_id = client.responses.create(
        model=model, input=[result], previous_response_id=r.id, tools=[WEATHER], max_output_tokens=32
    )
    check(by_id.output_text == by_items.output_text and by_id.usage.input_tokens_details.cached_tokens > 0,
          "the same answer when the call is continued by its response's id, from the prompt cache")

    events = list(client.responses.create(
        model=model, input=asked, tools=[WEATHER], tool_choice="required", max_output_tokens=64, stream=True
    ))
    kinds = [e.type for e in events]
    check("response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds,
          "a streamed call comes as function_call_arguments events")
    streamed = [o for o in events[-1].response.output if o.type == "function_call"]
    check([json.loads(f.arguments) for f in streamed] == [json.loads(f.arguments) for f in fcs],
          "and is the same call")


class City(BaseModel):
    name: str
    country: str


def structured(client: openai.OpenAI, model: str) -> None:
    r = client.responses.parse(
        model=model, input="Give a city in Japan as JSON.", text_format=City, max_output_tokens=48
    )
    check(isinstance(r.output_parsed, City), f"parse() reads a schema-bound answer ({r.output_parsed})")
    obj = client.responses.create(
        model=model, input="Describe a cat as JSON.", text={"format": {"type": "json_object"}}, max_output_tokens=40
    )
    check(isinstance(json.loads(obj.output_text), dict), f"json_object gives an object ({obj.status})")


def errors(client: openai.OpenAI, model: str, socket: str) -> None:
    raw = httpx.Client(transport=httpx.HTTPTransport(uds=socket), timeout=600)

    def refused(body: dict, needle: str, what: str) -> None:
        r = raw.post("http://pocketd/v1/responses", json={"model": model, **body})
        message = r.json().get("error", {}).get("message", "")
        check(r.status_code == 400 and needle in message, f"{what} ({message})")

    refused({"input": "hi", "frobnicate": 1}, "frobnicate", "an unknown field is refused by name")
    refused({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input_image", "an image part is refused by name")
    refused({"input": "hi", "text": {"format": {"type": "json_object", "schema": {}}}},
            "takes no other keys", "a format's stray key is refused")
    refused({"input": "hi", "tools": [{"type": "web_search", "name": "w"}]}, "function tools only",
            "a built-in tool is refused")
    refused({"input": []}, "input is empty", "an empty input is refused")
    # A schema whose least answer cannot fit in max_output_tokens, named as the client sent it.
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 40}}, "required": ["a"],
              "additionalProperties": False}
    r = raw.post("http://pocketd/v1/responses", json={
        "model": model, "input": "hi", "max_output_tokens": 4,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}}})
    error = r.json().get("error", {})
    check(r.status_code == 400 and error.get("param") == "max_output_tokens"
          and "shortest JSON the schema accepts" in error.get("message", ""),
          f"a max_output_tokens too small for any valid answer is refused naming it ({error})")
    try:
        client.responses.create(model="no-such-model", input="hi")
        check(False, "an unknown model is refused")
    except openai.NotFoundError:
        check(True, "an unknown model is a 404")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    client = unix_socket_client(args.socket)
    model = client.models.list().data[0].id
    answers(client, model)
    continues(client, model)
    calls(client, model)
    structured(client, model)
    errors(client, model, args.socket)
    print("all passed")


if __name__ == "__main__":
    main()
