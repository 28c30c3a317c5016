"""OpenAI's edges, through the `openai` package against a running pocketd: several choices
(`n`), streamed log-probabilities chunk by chunk, prompt arrays, a model alias, a GBNF grammar,
llama.cpp's /tokenize and /detokenize, tool calls cut by max_tokens, litellm's mapping of an over-long prompt,
and an app's earlier answers kept apart by the client's own `prompt_cache_key` (or `user`). Run by tests/openai_edges.rs; prints one line per
check and exits non-zero at the first that fails.

    python3 openai_edges.py --socket PATH --alias NAME
"""

import argparse
import json
import os
import sys

import httpx
from openai import BadRequestError, OpenAI

QUESTION = [{"role": "user", "content": "Name three colours."}]


def check(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAILED ") + what, flush=True)
    if not ok:
        sys.exit(1)


def several_choices(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=12, n=2, temperature=1.0, seed=7
    )
    check([c.index for c in r.choices] == [0, 1], f"n=2: two choices, indexed ({len(r.choices)})")
    check(all(c.message.content for c in r.choices), "n=2: each choice has text")
    check(
        r.usage.completion_tokens <= 24 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
        f"n=2: the prompt counted once, the choices' tokens summed ({r.usage})",
    )
    stream = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=12,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts = {0: "", 1: ""}
    finished = set()
    chunks = list(stream)
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    check(finished == {0, 1} and all(texts.values()), f"n=2 streamed: both choices end with text ({texts})")
    # Greedy: the same answer twice, and the same as without a stream.
    plain = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12)
    check(texts[0] == texts[1] == plain.choices[0].message.content, "n=2 greedy: both choices are the plain answer")
    check(not chunks[-1].choices and chunks[-1].usage.completion_tokens > 0, "n=2 streamed: the usage comes last")
    check(len({c.id for c in chunks}) == 1, "n=2 streamed: one id")


def streamed_logprobs(client: OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=16, stream=True, logprobs=True, top_logprobs=2
    )
    text, tokens, with_text = "", [], 0
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.content:
                with_text += 1
                check(c.logprobs is not None and len(c.logprobs.content) > 0, f"a content chunk carries logprobs ({c})")
            text += c.delta.content or ""
            if c.logprobs:
                tokens += c.logprobs.content
    check(with_text > 1, f"the answer came in several chunks ({with_text})")
    check("".join(t.token for t in tokens) == text, f"the chunks' tokens spell the text ({text!r})")
    check(all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in tokens), "each token has 2 alternatives")
    whole = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, logprobs=True, top_logprobs=2)
    check(
        [t.token for t in whole.choices[0].logprobs.content] == [t.token for t in tokens],
        "streamed and whole logprobs are the same tokens",
    )
    # Completions' legacy shape: offsets run on across chunks.
    stream = client.completions.create(model=model, prompt="One, two, three,", max_tokens=8, stream=True, logprobs=1)
    offsets, text = [], ""
    for chunk in stream:
        c = chunk.choices[0]
        if c.text:
            check(c.logprobs is not None and len(c.logprobs.tokens) > 0, "a completion chunk carries logprobs")
        text += c.text
        if c.logprobs:
            offsets += c.logprobs.text_offset
    check(offsets == sorted(offsets) and len(set(offsets)) == len(offsets), f"text offsets run on ({offsets})")


def prompt_arrays(client: OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt=["One, two,", "Red, green,"], max_tokens=4, n=2)
    check([c.index for c in r.choices] == [0, 1, 2, 3], "2 prompts x n=2: four choices in OpenAI's order")
    check(r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text, "greedy choices agree")


def alias(client: OpenAI, alias_name: str) -> None:
    ids = [m.id for m in client.models.list().data]
    check(alias_name in ids, f"the alias is listed ({ids})")
    r = client.chat.completions.create(model=alias_name, messages=QUESTION, max_tokens=4)
    check(r.choices[0].message.content is not None and r.model != alias_name, f"the alias answers as {r.model}")


def tokenize(http: httpx.Client) -> None:
    t = http.post("http://pocketd/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
    check(t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] > 0, f"/tokenize ({t})")
    ids = [p["id"] for p in t["tokens"]]
    check("".join(p["piece"] for p in t["tokens"]).strip() == "Hello world", "the pieces spell the text")
    d = http.post("http://pocketd/detokenize", json={"tokens": ids}).json()
    check(d["content"] == "Hello world", f"/detokenize reads it back ({d})")
    chat = http.post("http://pocketd/tokenize", json={"messages": QUESTION}).json()
    check(chat["count"] > t["count"], "messages are tokenized with the chat template")
    bad = http.post("http://pocketd/detokenize", json={"tokens": [10**9]})
    check(bad.status_code == 400 and bad.json()["error"]["param"] == "tokens", "an id outside the vocabulary is a 400")


def gbnf(client: OpenAI, model: str) -> None:
    # What a llama.cpp user sends in `grammar`: GBNF, converted to Lark by pocketd.
    grammar = 'root ::= answer "."\nanswer ::= "yes" | "no"\n'
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Is the sky blue?"}], max_tokens=8,
        extra_body={"grammar": grammar},
    )
    text = r.choices[0].message.content
    check(text in ("yes.", "no."), f"a GBNF grammar is followed ({text!r})")
    try:
        client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=8, extra_body={"grammar": 'root ::= <[1000]>'}
        )
        check(False, "a GBNF token reference is refused")
    except BadRequestError as e:
        check("GBNF grammar" in e.message and e.body["param"] == "grammar", f"a GBNF token reference is refused ({e.message})")


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                                     "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "unit", "days"]}}}


def cut_tool_calls(client: OpenAI, model: str) -> None:
    # A call that max_tokens cuts is closed in time: its arguments are whole and valid,
    # `finish_reason` says length, and nothing of the markup is left in the content.
    import jsonschema

    for max_tokens in (40, 44, 48):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What will the weather be in Paris for three days, in celsius?"}],
            tools=[WEATHER], tool_choice="required", max_tokens=max_tokens,
        )
        c = r.choices[0]
        calls = c.message.tool_calls or []
        args = calls[0].function.arguments if calls else None
        try:
            jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
            valid = True
        except (TypeError, ValueError, jsonschema.ValidationError):
            valid = False
        check(len(calls) == 1 and valid and not c.message.content,
              f"a call cut at {max_tokens} tokens is whole ({c.finish_reason}: {args}, content {c.message.content!r})")


def litellm_context_window(client: OpenAI, model: str) -> None:
    # litellm maps a provider's errors by their text; pocketd words an over-long prompt as
    # OpenAI does, so litellm raises its ContextWindowExceededError (apps catch it to trim).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the internet
    import litellm

    try:
        litellm.completion(
            model=f"openai/{model}", messages=[{"role": "user", "content": "word " * 6000}], max_tokens=8,
            client=client, api_base="http://pocketd/v1", api_key="not-needed",
        )
        check(False, "litellm: an over-long prompt is refused")
    except litellm.ContextWindowExceededError as e:
        check(True, f"litellm: an over-long prompt is a ContextWindowExceededError ({str(e)[:80]}…)")
    r = litellm.completion(
        model=f"openai/{model}", messages=QUESTION, max_tokens=8, client=client,
        api_base="http://pocketd/v1", api_key="not-needed",
    )
    check(bool(r.choices[0].message.content), "litellm: and an answer otherwise")


def earlier_answers_by_key(client: OpenAI, model: str) -> None:
    """The client's own `prompt_cache_key` parameter (and `user`, where it is absent) names the
    app whose earlier answers pocketd drafts from: drafted for the same key, never for another."""
    home = [
        {"role": "system", "content": "Turn the command into one JSON object with the keys action, device, room."},
        {"role": "user", "content": "Turn off the kitchen lights."},
    ]
    run = os.urandom(4).hex()

    def ask(**key: str):
        r = client.chat.completions.create(
            model=model, messages=home, max_tokens=32, temperature=0, extra_body={"spec": "suffix"}, **key
        )
        return r.choices[0].message.content, r.to_dict().get("timings", {}).get("recalled")

    first, recalled = ask(prompt_cache_key=f"edges {run} a")
    check(bool(first) and recalled == 0, f"prompt_cache_key: a first answer has nothing to draft from ({recalled})")
    again, recalled = ask(prompt_cache_key=f"edges {run} a")
    check(again == first and recalled > 0, f"prompt_cache_key: the app's earlier answer is drafted ({recalled})")
    other, recalled = ask(prompt_cache_key=f"edges {run} b")
    check(other == first and recalled == 0, f"prompt_cache_key: another app's is not ({recalled})")
    by_user, recalled = ask(user=f"edges {run} a")
    check(by_user == first and recalled > 0, f"user: keys the same answers where prompt_cache_key is absent ({recalled})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--alias", required=True)
    args = parser.parse_args()
    http = httpx.Client(transport=httpx.HTTPTransport(uds=args.socket), timeout=600)
    client = OpenAI(base_url="http://pocketd/v1", api_key="not-needed", http_client=http)
    model = client.models.list().data[0].id
    several_choices(client, model)
    streamed_logprobs(client, model)
    prompt_arrays(client, model)
    alias(client, args.alias)
    tokenize(http)
    gbnf(client, model)
    cut_tool_calls(client, model)
    litellm_context_window(client, model)
    earlier_answers_by_key(client, model)
    print("all passed")


if __name__ == "__main__":
    main()
