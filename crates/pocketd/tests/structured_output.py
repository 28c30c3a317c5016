"""Structured output from a running pocketd, as apps ask for it: every JSON schema of
tests/fixtures/schemas.json over HTTP (OpenAI's Python client, response_format json_schema
strict) and over D-Bus (busctl, the json_schema option), json_object prompts over both, each
answer parsed and validated with the jsonschema package; then, for the speed report, the same
schemas with speculation off and on (auto), which must give the same tokens; and, with
--cut, every schema again with one max_tokens so low that the longest third of the answers
are cut: the constraint closes them in time, so that every answer parses (a schema whose least
answer takes more tokens than that is refused with a 400 naming max_tokens, and counted).

    python3 tests/structured_output.py --socket S --bus ADDRESS --models smollm2,qwen [--compare smollm2] [--cut]

Prints one line per transport and model with the counts, and a speed line per compared model;
exits 1 if any answer does not parse or validate, or if speculation changed a token.
"""

import argparse
import json
import pathlib
import subprocess
import sys

import httpx
import jsonschema
from openai import BadRequestError, OpenAI

HERE = pathlib.Path(__file__).parent
OBJECT_PROMPTS = [
    "Describe a cat as a JSON object.",
    "Give me a JSON object with facts about the Moon.",
    "Return a JSON object describing your favourite programming language.",
    "Answer in JSON: what are the three primary colours?",
    "Summarise the plot of Hamlet as a JSON object.",
]
MAX_TOKENS = 400


def busctl(bus, model, prompt, options):
    """`Generate` over D-Bus; options are (key, signature, value) triples."""
    args = ["busctl", f"--address={bus}", "--json=short", "call", "org.pocketd.Pocketd1", "/org/pocketd/Pocketd1",
            "org.pocketd.Pocketd1", "Generate", "ssa{sv}", model, prompt, str(len(options))]
    for key, sig, value in options:
        args += [key, sig, str(value)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"busctl failed: {out.stderr.strip()}")
    text, stats = json.loads(out.stdout)["data"]
    return text, stats


def check(text, schema):
    """None if `text` is JSON valid against `schema`, else why not."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not JSON ({e})"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return f"invalid: {e.message}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--bus", help="D-Bus address of the daemon's bus (skip D-Bus without it)")
    parser.add_argument("--models", default="smollm2")
    parser.add_argument("--compare", default="", help="models to compare speculation off and on")
    parser.add_argument("--compare-spec", default="auto", help="the speculation compared with off")
    parser.add_argument("--cut", action="store_true", help="also every schema with max_tokens too low")
    args = parser.parse_args()
    COMPARE_SPEC = args.compare_spec
    schemas = json.loads((HERE / "fixtures/schemas.json").read_text())
    http = httpx.Client(transport=httpx.HTTPTransport(uds=args.socket), timeout=600)
    client = OpenAI(base_url="http://pocketd/v1", api_key="not-needed", http_client=http)
    failures = []

    def http_schema(model, case, spec, tokens=False, max_tokens=MAX_TOKENS):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": case["prompt"]}], max_tokens=max_tokens,
            response_format={"type": "json_schema",
                             "json_schema": {"name": case["name"], "schema": case["schema"], "strict": True}},
            extra_body={"spec": spec, "return_tokens": tokens, "cache_prompt": False},
        )
        extra = dict(reply.model_extra)
        extra["completion_tokens"] = reply.usage.completion_tokens
        extra["finish_reason"] = reply.choices[0].finish_reason
        return reply.choices[0].message.content, extra

    for model in filter(None, args.models.split(",")):
        # HTTP, each schema.
        valid, mask_ms, tokens = 0, 0.0, 0
        lengths = {}
        for case in schemas:
            text, extra = http_schema(model, case, "auto")
            lengths[case["name"]] = extra["completion_tokens"]
            why = check(text, case["schema"])
            if why:
                failures.append(f"http {model} {case['name']}: {why}: {text!r}")
            else:
                valid += 1
            mask_ms += extra["timings"]["constraint_ms"]
            tokens += extra["completion_tokens"]
        print(f"http {model}: {valid}/{len(schemas)} schemas valid; grammar {mask_ms / max(tokens, 1):.3f} ms per token")
        # HTTP, json_object.
        parsed = 0
        for prompt in OBJECT_PROMPTS:
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS,
                response_format={"type": "json_object"})
            why = check(reply.choices[0].message.content, {"type": "object"})
            if why:
                failures.append(f"http {model} json_object {prompt!r}: {why}")
            else:
                parsed += 1
        print(f"http {model}: {parsed}/{len(OBJECT_PROMPTS)} json_object answers parse")
        if args.cut:
            cut, parse, schema_valid, cut_parse, refused = 0, 0, 0, 0, 0
            # One token less than the third-longest answer's length: a third at least must be cut.
            third = -(-len(lengths) // 3)
            short = sorted(lengths.values(), reverse=True)[third - 1] - 1
            for case in schemas:
                try:
                    text, extra = http_schema(model, case, "auto", max_tokens=short)
                except BadRequestError as e:
                    # A schema whose least answer takes more than max_tokens is refused, saying so.
                    if e.body.get("param") != "max_tokens" or "the shortest JSON the schema accepts" not in e.message:
                        failures.append(f"cut {model} {case['name']}: {e}")
                    print(f"refused: cut {model} {case['name']} at {short} tokens: {e.body.get('message')}")
                    refused += 1
                    continue
                was_cut = extra["finish_reason"] == "length"
                cut += was_cut
                try:
                    json.loads(text)
                    parse += 1
                    cut_parse += was_cut
                except ValueError as e:
                    failures.append(f"cut {model} {case['name']} at {short} tokens: not JSON ({e}): {text!r}")
                schema_valid += check(text, case["schema"]) is None
            print(f"cut {model}: max_tokens {short}: {cut}/{len(schemas)} answers cut, {cut_parse}/{cut} of them closed, "
                  f"{parse}/{len(schemas) - refused} parse, {schema_valid}/{len(schemas) - refused} also valid against "
                  f"the schema; {refused} refused (least answer longer than max_tokens)")
            if (cut + refused) * 3 < len(schemas):
                failures.append(f"cut {model}: only {cut} answers were cut")
        if not args.bus:
            continue
        valid = 0
        for case in schemas:
            text, _ = busctl(args.bus, model, case["prompt"],
                             [("json_schema", "s", json.dumps(case["schema"])), ("max_tokens", "u", MAX_TOKENS)])
            why = check(text, case["schema"])
            if why:
                failures.append(f"dbus {model} {case['name']}: {why}: {text!r}")
            else:
                valid += 1
        print(f"dbus {model}: {valid}/{len(schemas)} schemas valid")
        parsed = 0
        for prompt in OBJECT_PROMPTS:
            text, _ = busctl(args.bus, model, prompt, [("json_object", "b", "true"), ("max_tokens", "u", MAX_TOKENS)])
            why = check(text, {"type": "object"})
            if why:
                failures.append(f"dbus {model} json_object {prompt!r}: {why}")
            else:
                parsed += 1
        print(f"dbus {model}: {parsed}/{len(OBJECT_PROMPTS)} json_object answers parse")

    for model in filter(None, args.compare.split(",")):
        seconds = {"off": 0.0, COMPARE_SPEC: 0.0}
        generated = 0
        forced = [0, 0]
        for case in schemas:
            runs = {}
            for spec in ("off", COMPARE_SPEC):
                text, extra = http_schema(model, case, spec, tokens=True)
                runs[spec] = extra["tokens"]
                t = extra["timings"]
                n = extra["completion_tokens"]
                if t["decode_tok_per_s"] > 0:
                    seconds[spec] += (n - 1) / t["decode_tok_per_s"]
                if spec == COMPARE_SPEC:
                    generated += n - 1
                    forced[0] += t["forced"]
                    forced[1] += t["forced_accepted"]
            if runs["off"] != runs[COMPARE_SPEC]:
                failures.append(f"speculation changed the tokens of {model} {case['name']}")
        speedup = seconds["off"] / seconds[COMPARE_SPEC] if seconds[COMPARE_SPEC] else 0.0
        print(f"speed {model}: constrained decoding {generated / seconds['off']:.1f} tok/s plain, "
              f"{generated / seconds[COMPARE_SPEC]:.1f} tok/s with forced-token drafting ({COMPARE_SPEC}): {speedup:.2f}x, "
              f"identical tokens; forced {forced[1]}/{forced[0]} accepted")

    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
