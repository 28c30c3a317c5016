"""The openai package's embeddings.create against a running pocketd, checked against the
reference vectors (sentence-transformers) in fixtures/embeddings/.

Run by tests/embeddings.rs: embeddings.py --socket PATH --model NAME --fixture FILE
Prints one line per check and "all passed" at the end."""

import argparse
import base64
import json
import sys
import threading

import httpx
import numpy as np
import openai

p = argparse.ArgumentParser()
p.add_argument("--socket", required=True)
p.add_argument("--model", required=True)
p.add_argument("--fixture", required=True)
p.add_argument("--text-model", default="smollm2")
a = p.parse_args()

fx = json.load(open(a.fixture))
sentences, ref = fx["sentences"], np.array(fx["embeddings"])
http = httpx.Client(transport=httpx.HTTPTransport(uds=a.socket), timeout=120)
client = openai.OpenAI(base_url="http://localhost/v1", api_key="none", http_client=http, max_retries=0)


def check(name, ok, detail=""):
    print(("ok    " if ok else "FAIL  ") + name + (f": {detail}" if detail else ""))
    if not ok:
        sys.exit(1)


def cosines(ours, theirs):
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    return (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)


def bad_request(param, **kwargs):
    try:
        client.embeddings.create(**kwargs)
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return body.get("param") == param, f"{e.status_code} param={body.get('param')}: {body.get('message')}"
    return False, "no error"


# Every fixture sentence at once (the over-long one truncated), the client's default
# encoding (it asks for base64 and decodes it).
r = client.embeddings.create(model=a.model, input=sentences, extra_body={"truncate": True})
ours = np.array([d.embedding for d in r.data])
cos = cosines(ours, ref)
check("one vector per input, in order", [d.index for d in r.data] == list(range(len(sentences))))
check("384 values each", ours.shape == (len(sentences), 384), str(ours.shape))
check("unit vectors", np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-4))
check(
    f"cosine with sentence-transformers >= 0.999 on all {len(sentences)} sentences",
    cos.min() >= 0.999,
    f"min {cos.min():.6f} (sentence {int(cos.argmin())}), mean {cos.mean():.6f}",
)
check("usage counts the tokens read", r.usage.prompt_tokens == sum(min(n, 256) for n in fx["token_counts"]),
      f"{r.usage.prompt_tokens}")

# Retrieval: each paraphrase's nearest neighbour among all sentences is its partner.
sims = ours @ ours.T
np.fill_diagonal(sims, -1)
misses = [(i, j) for i, j in fx["paraphrase_pairs"] if sims[i].argmax() != j or sims[j].argmax() != i]
check(f"each of {len(fx['paraphrase_pairs'])} paraphrase pairs ranks its partner first", not misses, str(misses))

# Floats, as JSON numbers, are the same vectors; so is raw base64 decoded by hand.
raw = http.post("http://localhost/v1/embeddings",
                json={"model": a.model, "input": sentences[:3], "encoding_format": "float"}).json()
# (A vector's last bits depend on the pass it shared with others, so same is cosine > 0.99999.)
check("encoding_format float", cosines([d["embedding"] for d in raw["data"]], ours[:3]).min() > 0.99999)
raw = http.post("http://localhost/v1/embeddings",
                json={"model": a.model, "input": sentences[0], "encoding_format": "base64"}).json()
v = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
check("encoding_format base64 is little-endian f32", v.shape == (384,) and cosines([v], [ours[0]])[0] > 0.99999)
check("usage has OpenAI's fields", raw["usage"]["total_tokens"] == raw["usage"]["prompt_tokens"] > 0, str(raw["usage"]))

# Token ids are read as they are: the tokens of a text give the text's vector.
tok = http.post("http://localhost/tokenize", json={"model": a.model, "content": sentences[0], "add_special": True}).json()
r = client.embeddings.create(model=a.model, input=[tok["tokens"]])
check("token ids give the text's vector", cosines([r.data[0].embedding], [ours[0]])[0] > 0.99999)

# dimensions: the model's own size is accepted; another is refused by name.
r = client.embeddings.create(model=a.model, input="x", dimensions=384)
check("dimensions 384 accepted", len(r.data[0].embedding) == 384)
check("dimensions 128 refused (param dimensions)", *bad_request("dimensions", model=a.model, input="x", dimensions=128))

# Bad input: a clear 400 naming the field, and the daemon goes on.
long_text = sentences[fx["long"][0]]
check("an input over the model's length is refused (param input)", *bad_request("input", model=a.model, input=long_text))
check("an empty list is refused (param input)", *bad_request("input", model=a.model, input=[]))
check("a token outside the vocabulary is refused (param input)",
      *bad_request("input", model=a.model, input=[[101, 999999, 102]]))
check("encoding_format other than float/base64 refused",
      *bad_request("encoding_format", model=a.model, input="x", encoding_format="int8"))
check("a text model is not an embedding model (param model)", *bad_request("model", model=a.text_model, input="x"))
try:
    client.chat.completions.create(model=a.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    check("an embedding model does not chat", False, "answered")
except openai.APIStatusError as e:
    check("an embedding model does not chat", e.status_code == 400 and "embedding model" in str(e), str(e))

# Several clients at once each get their own vectors.
results, errors = {}, []


def worker(k):
    try:
        chunk = sentences[k * 8:(k + 1) * 8]
        r = client.embeddings.create(model=a.model, input=chunk)
        results[k] = cosines([d.embedding for d in r.data], ref[k * 8:(k + 1) * 8]).min()
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(repr(e))


threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check("6 clients at once, each its own vectors", not errors and min(results.values()) >= 0.999,
      f"{errors or min(results.values())}")
print("all passed")
