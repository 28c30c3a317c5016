"""Talk to pocketd with Anthropic's own Python client, over the Unix socket.

    pip install anthropic
    python3 examples/anthropic_client.py [--socket /run/pocketd/pocketd.sock] [--model NAME]

As with the OpenAI client, the HTTP package under the client (httpx2 for anthropic 2.x,
httpx before) speaks HTTP over the socket when its transport is given `uds=`.
"""

import argparse

import importlib

import anthropic

WEATHER = {
    "name": "get_weather",
    "description": "The weather now in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def unix_socket_client(socket: str) -> anthropic.Anthropic:
    """Anthropic's client over a Unix socket. Its 2.x releases are built on httpx2, earlier
    ones on httpx; whichever it takes, that package's transport speaks HTTP over the socket
    (`uds=`), and the host in base_url is only a name. No API key is needed, but the client
    insists on one."""
    for name in ("httpx2", "httpx"):
        try:
            http = importlib.import_module(name)
            transport = http.HTTPTransport(uds=socket)
            return anthropic.Anthropic(
                base_url="http://pocketd", api_key="not-needed", http_client=http.Client(transport=transport, timeout=600)
            )
        except (ImportError, TypeError):
            continue
    raise SystemExit("neither httpx2 nor httpx fits this anthropic package")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default="/run/pocketd/pocketd.sock")
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()

    client = unix_socket_client(args.socket)

    question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    reply = client.messages.create(model=args.model, max_tokens=24, messages=question)
    print("answer:", reply.content[0].text, f"({reply.stop_reason})")

    with client.messages.stream(model=args.model, max_tokens=24, messages=question) as stream:
        print("streamed:", "".join(stream.text_stream))

    # A tool call, its result sent back, and the answer from it.
    weather = [{"role": "user", "content": "What is the weather in Oslo?"}]
    call = client.messages.create(
        model=args.model, max_tokens=64, messages=weather, tools=[WEATHER], tool_choice={"type": "any"}
    )
    use = next(b for b in call.content if b.type == "tool_use")
    print("tool call:", use.name, use.input)
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}
    follow = weather + [{"role": "assistant", "content": call.content}, {"role": "user", "content": [result]}]
    answer = client.messages.create(model=args.model, max_tokens=48, messages=follow, tools=[WEATHER])
    print("answer:", answer.content[0].text)


if __name__ == "__main__":
    main()
