"""OpenAI's Responses API on pocketd, with OpenAI's own Python client over the Unix socket:
an answer, a stream of events, a function call and its result, and a conversation continued
by `previous_response_id` (whose prompt the prompt cache already holds).

    pip install openai
    python3 examples/openai_responses.py [--socket /run/pocketd/pocketd.sock] [--model NAME]
"""

import argparse
import json

import httpx
from openai import OpenAI

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def unix_socket_client(socket: str) -> OpenAI:
    """OpenAI's client over a Unix socket: httpx's transport speaks HTTP there (`uds=`), the
    host in base_url is only a name, and any API key does."""
    http = httpx.Client(transport=httpx.HTTPTransport(uds=socket), timeout=600)
    return OpenAI(base_url="http://pocketd/v1", api_key="not-needed", http_client=http)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default="/run/pocketd/pocketd.sock")
    parser.add_argument("--model", default=None, help="default: the daemon's default model")
    args = parser.parse_args()
    client = unix_socket_client(args.socket)
    model = args.model or client.models.list().data[0].id

    first = client.responses.create(
        model=model, instructions="Answer briefly.", input="What is the capital of France?", max_output_tokens=32
    )
    print("answer:", first.output_text)

    # The stream's events: response.created, output_text deltas, … response.completed.
    stream = client.responses.create(model=model, input="Name three colours.", max_output_tokens=32, stream=True)
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="", flush=True)
    print()

    # A stored response continues by its id: its conversation is not sent again, and the
    # prompt cache has its tokens (usage.input_tokens_details.cached_tokens).
    follow = client.responses.create(
        model=model,
        instructions="Answer briefly.",
        input="And of Italy?",
        previous_response_id=first.id,
        max_output_tokens=32,
    )
    print("follow-up:", follow.output_text, "| cached prompt tokens:", follow.usage.input_tokens_details.cached_tokens)

    # A function call, and its result sent back.
    asked = [{"role": "user", "content": "What is the weather in Oslo?"}]
    call = client.responses.create(
        model=model, input=asked, tools=[WEATHER], tool_choice="required", max_output_tokens=64
    )
    fc = next(item for item in call.output if item.type == "function_call")
    print("call:", fc.name, json.loads(fc.arguments))
    result = {"type": "function_call_output", "call_id": fc.call_id, "output": "Sunny, 21 C"}
    answer = client.responses.create(
        model=model, input=[result], previous_response_id=call.id, tools=[WEATHER], max_output_tokens=48
    )
    print("with its result:", answer.output_text)


if __name__ == "__main__":
    main()
