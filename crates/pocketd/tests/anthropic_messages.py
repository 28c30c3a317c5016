"""Anthropic's Messages API through the `anthropic` package against a running pocketd:
messages, a stream, stop sequences, a tool-use round trip, count_tokens and errors. Run by
tests/daemon.rs; prints one line per check and exits non-zero at the first that fails.

    python3 anthropic_messages.py --socket PATH
"""

import argparse
import pathlib
import sys

import anthropic
import httpx

# The example's client over the Unix socket (httpx2 or httpx, whichever the package takes).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
from anthropic_client import WEATHER, unix_socket_client  # noqa: E402


def check(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAILED ") + what, flush=True)
    if not ok:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    client = unix_socket_client(args.socket)
    model = "smollm2"
    question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]

    counted = client.messages.count_tokens(model=model, messages=question)
    check(counted.input_tokens > 0, f"count_tokens: {counted.input_tokens}")
    m = client.messages.create(model=model, max_tokens=24, messages=question)
    text = m.content[0].text
    check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), f"a message ({m.id})")
    check("Paris" in text and m.stop_reason == "end_turn", f"it answers: {text!r}, {m.stop_reason}")
    check(
        m.usage.input_tokens + m.usage.cache_read_input_tokens == counted.input_tokens and m.usage.output_tokens > 0,
        f"usage agrees with count_tokens ({m.usage})",
    )

    with client.messages.stream(model=model, max_tokens=24, messages=question) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(streamed == text == final.content[0].text, f"the stream gives the same answer ({streamed!r})")
    check(final.stop_reason == "end_turn" and final.usage.output_tokens == m.usage.output_tokens, "and the same end")

    poem = [{"role": "user", "content": "Write a long poem about the sea."}]
    cut = client.messages.create(model=model, max_tokens=3, system="You are a poet.", messages=poem)
    check(cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3, f"max_tokens ends it ({cut.stop_reason})")
    count = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    stopped = client.messages.create(model=model, max_tokens=48, messages=count, stop_sequences=["4"])
    check(
        stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "4" and "4" not in stopped.content[0].text,
        f"a stop sequence ends it ({stopped.stop_reason}, {stopped.content})",
    )

    weather = [{"role": "user", "content": "What is the weather in Oslo?"}]
    call = client.messages.create(
        model=model, max_tokens=64, messages=weather, tools=[WEATHER], tool_choice={"type": "any"}
    )
    uses = [b for b in call.content if b.type == "tool_use"]
    check(
        call.stop_reason == "tool_use" and len(uses) >= 1 and uses[0].name == "get_weather",
        f"the model calls the tool ({call.content})",
    )
    check(isinstance(uses[0].input, dict) and "city" in uses[0].input, f"with its input ({uses[0].input})")
    follow = weather + [
        {"role": "assistant", "content": call.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 C"}]},
    ]
    answer = client.messages.create(model=model, max_tokens=48, messages=follow, tools=[WEATHER])
    check(
        answer.stop_reason in ("end_turn", "max_tokens") and answer.content and answer.content[0].type == "text",
        f"and answers from its result ({answer.content})",
    )
    with client.messages.stream(
        model=model, max_tokens=64, messages=weather, tools=[WEATHER], tool_choice={"type": "any"}
    ) as stream:
        final = stream.get_final_message()
    streamed_uses = [b for b in final.content if b.type == "tool_use"]
    check(
        [u.input for u in streamed_uses] == [u.input for u in uses] and final.stop_reason == "tool_use",
        "a streamed call is the same call",
    )

    try:
        client.messages.create(model="no-such-model", max_tokens=8, messages=question)
        check(False, "an unknown model is refused")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", "an unknown model is a not_found_error")
    raw = httpx.Client(transport=httpx.HTTPTransport(uds=args.socket), timeout=600)
    r = raw.post("http://pocketd/v1/messages", json={"model": model, "messages": question})
    body = r.json()
    check(
        r.status_code == 400 and body["type"] == "error" and "max_tokens" in body["error"]["message"],
        f"a request without max_tokens is an invalid_request_error ({body})",
    )
    print("all passed")


if __name__ == "__main__":
    main()
