"""A tool-call round trip with OpenAI's Python client over pocketd's Unix socket.

    pip install openai
    python3 examples/openai_tools.py [--socket /run/pocketd/pocketd.sock] [--model NAME] [--stream]

The model is offered a function; it answers with a call (`tool_calls`, each with an id and
JSON arguments that match the function's parameters); the program runs the function and
sends its result back as a `tool` message; the model answers in words.
"""

import argparse
import json

import httpx
from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    }
]


def get_weather(city: str, unit: str) -> dict:
    return {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit, "sky": "sunny"}


def ask(client, model, messages, stream, **kwargs):
    """One chat completion; a stream's chunks are put back together as the client's users do."""
    if not stream:
        reply = client.chat.completions.create(model=model, messages=messages, **kwargs)
        choice = reply.choices[0]
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in choice.message.tool_calls or []
        ]
        return choice.message.content, calls, choice.finish_reason
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            call = calls.setdefault(c.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] = c.id or call["id"]
            call["function"]["name"] += c.function.name or ""
            call["function"]["arguments"] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content or None, [calls[i] for i in sorted(calls)], finish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default="/run/pocketd/pocketd.sock")
    parser.add_argument("--model", default=None, help="default: the daemon's default model")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--tool-choice", default="required", help="auto, required or a function's name")
    args = parser.parse_args()

    http = httpx.Client(transport=httpx.HTTPTransport(uds=args.socket), timeout=300)
    client = OpenAI(base_url="http://pocketd/v1", api_key="not-needed", http_client=http)
    model = args.model or client.models.list().data[0].id
    choice = args.tool_choice
    if choice not in ("auto", "required", "none"):
        choice = {"type": "function", "function": {"name": choice}}

    messages = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]
    content, calls, finish = ask(client, model, messages, args.stream, tools=TOOLS, tool_choice=choice, max_tokens=120)
    print("finish_reason:", finish)
    assert finish == "tool_calls" and calls, f"expected a tool call, got {content!r} ({finish})"
    messages.append({"role": "assistant", "content": content, "tool_calls": calls})
    for call in calls:
        arguments = json.loads(call["function"]["arguments"])
        print("call:", call["id"], call["function"]["name"], arguments)
        result = get_weather(**arguments)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})

    content, calls, finish = ask(client, model, messages, args.stream, tools=TOOLS, tool_choice="none", max_tokens=60)
    print("answer:", content)
    assert content and not calls, f"expected an answer in words, got {calls}"


if __name__ == "__main__":
    main()
