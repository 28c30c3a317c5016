"""Talk to pocketd with OpenAI's own Python client, over the Unix socket.

    pip install openai
    python3 examples/openai_client.py [--socket /run/pocketd/pocketd.sock] [--model NAME]

httpx (which the client is built on) speaks HTTP over a Unix socket when its transport is
given `uds=`; the host in base_url is then only a name. pocketd needs no API key, but the
client insists on one, so any string does.
"""

import argparse

import httpx
from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default="/run/pocketd/pocketd.sock")
    parser.add_argument("--model", default=None, help="default: the daemon's default model")
    args = parser.parse_args()

    http = httpx.Client(transport=httpx.HTTPTransport(uds=args.socket))
    client = OpenAI(base_url="http://pocketd/v1", api_key="not-needed", http_client=http)

    models = client.models.list()
    model = args.model or models.data[0].id
    print("models:", ", ".join(m.id for m in models.data))

    question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    reply = client.chat.completions.create(model=model, messages=question, max_tokens=24)
    print("answer:", reply.choices[0].message.content)
    print("usage:", reply.usage.prompt_tokens, "prompt +", reply.usage.completion_tokens, "generated tokens")

    # pocketd's own request fields go through extra_body. With include_usage the stream ends
    # with a chunk that has no choices and the usage, as OpenAI's does.
    stream = client.chat.completions.create(
        model=model,
        messages=question,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"spec": "suffix"},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    print("streamed:", text)
    usage = chunks[-1].usage
    print("streamed usage:", usage.prompt_tokens, "prompt +", usage.completion_tokens, "generated tokens")
    ids = {chunk.id for chunk in chunks}
    print("stream id:", ", ".join(ids))

    completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8)
    print("completion:", completion.choices[0].text)


if __name__ == "__main__":
    main()
