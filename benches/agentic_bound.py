#!/usr/bin/env python3
"""How fast could any drafter that copies earlier text make an agentic stream on this device?

Replays an agentic workload (benches/agentic.jsonl) through a running pocketd with `spec: off`,
greedy, one prompt_cache_key per app, and takes the answers' token ids (`return_tokens`) and the
prompts' (`/tokenize` with the messages). Then, for every position of every answer, it finds the
longest run of the answer's next tokens that appears in text a drafter could have seen there:
the app's earlier answers, the request's prompt and the answer so far. A drafter that copies
(ours, SuffixDecoding's, vLLM's `suffix`) can only ever draft such a run, so an oracle that
always drafts the whole run, no more, and sizes each pass to the device's cost curve by dynamic
programming, bounds what copying can reach:

    speed-up bound = tokens / (sum over passes of cost(pass width)), against 1 step per token

Two bounds are printed: any run found anywhere ("anywhere"), and runs that follow the same
`--context` tokens as the answer does at that point ("after context", nearer to what a suffix
drafter matches). Each for the cost curve given (`--cost`, steps for passes of 1, 2, ... tokens,
as `pocket tune` prints them) and for a flat curve (a pass of any width costs one step, what a
GPU nearly gives) up to `--max-pass` tokens. The figures are upper bounds: the oracle knows
the answer.

    python3 benches/agentic_bound.py --socket /tmp/pocketd.sock --model smollm2-135m \
        --cost 1,1.29,1.5,1.75,2.0,2.3,2.6,3.0
"""

import argparse
import http.client
import json
import socket
import sys


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=600):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def post(sock, path, body):
    conn = UnixConnection(sock)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        sys.exit(f"{path}: HTTP {resp.status}: {data.decode(errors='replace')}")
    return json.loads(data)


def run_len(answer, t, seq, s):
    """Tokens from answer[t] on that equal seq from s on."""
    n = 0
    while t + n < len(answer) and s + n < len(seq) and answer[t + n] == seq[s + n]:
        n += 1
    return n


def longest_runs(answer, prompt, earlier, context):
    """Per position t of `answer`: the longest run of answer[t:] seen before t, anywhere and
    after the same `context` tokens."""
    anywhere, after = [], []
    for t in range(len(answer)):
        known = prompt + answer[:t]
        seqs = earlier + [known]
        ctx = known[-context:] if context else []
        best_any = best_ctx = 0
        for seq in seqs:
            for s in range(len(seq)):
                n = run_len(answer, t, seq, s)
                if n == 0:
                    continue
                best_any = max(best_any, n)
                if n > best_ctx and len(ctx) == context and s >= context and seq[s - context:s] == ctx:
                    best_ctx = n
        anywhere.append(best_any)
        after.append(best_ctx)
    return anywhere, after


def schedule_cost(runs, cost):
    """Least steps to produce len(runs) tokens when a pass of w tokens costs cost[w - 1] and
    may draft at most runs[t] tokens at position t (all of them accepted)."""
    n = len(runs)
    best = [0.0] * (n + 1)
    for t in range(n - 1, -1, -1):
        options = []
        for d in range(0, min(runs[t], len(cost) - 1) + 1):
            options.append(cost[d] + best[min(n, t + d + 1)])
        best[t] = min(options)
    return best[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", default="benches/agentic.jsonl")
    ap.add_argument("--cost", required=True, help="steps for passes of 1, 2, ... tokens, comma separated")
    ap.add_argument("--max-pass", type=int, default=16, help="widest pass of the flat curve")
    ap.add_argument("--context", type=int, default=2, help="tokens a run must follow for 'after context'")
    ap.add_argument("--json", help="write the answers' tokens and the runs here")
    args = ap.parse_args()

    cost = [float(x) for x in args.cost.split(",")]
    if not cost or abs(cost[0] - 1.0) > 1e-9:
        sys.exit("--cost starts with the pass of one token, 1")
    flat = [1.0] * args.max_pass

    requests = [json.loads(line) for line in open(args.prompts) if line.strip()]
    answers_by_app = {}
    rows = []
    for i, req in enumerate(requests):
        app = req.get("app", "app")
        body = {
            "model": args.model,
            "messages": req["messages"],
            "max_tokens": req.get("max_tokens", 128),
            "temperature": 0,
            "spec": "off",
            "return_tokens": True,
            "prompt_cache_key": f"agentic-bound {app}",
        }
        answer = post(args.socket, "/v1/chat/completions", body)["tokens"]
        prompt = post(args.socket, "/tokenize", {"model": args.model, "messages": req["messages"]})["tokens"]
        earlier = answers_by_app.setdefault(app, [])
        anywhere, after = longest_runs(answer, prompt, list(earlier), args.context)
        earlier.append(answer)
        rows.append({"id": req.get("id", str(i)), "app": app, "tokens": answer, "anywhere": anywhere, "after": after})
        print(f"{i + 1:2}/{len(requests)} {req.get('id', '')}: {len(answer)} tokens", file=sys.stderr)

    halves = {"first half": rows[: len(rows) // 2], "second half": rows[len(rows) // 2 :], "all": rows}
    print(f"model {args.model}; cost curve {cost}; context {args.context}")
    print(f"{'part':12} {'tokens':>6} {'mean run':>8} | {'anywhere':>9} {'after ctx':>9} | {'flat any':>9} {'flat ctx':>9}")
    for name, part in halves.items():
        tokens = sum(len(r["tokens"]) for r in part)
        runs = [x for r in part for x in r["after"]]
        figures = []
        for curve in (cost, flat):
            for key in ("anywhere", "after"):
                steps = sum(schedule_cost(r[key], curve) for r in part)
                figures.append(tokens / steps if steps else float("nan"))
        mean = sum(runs) / len(runs) if runs else 0.0
        print(f"{name:12} {tokens:6} {mean:8.2f} | {figures[0]:8.2f}x {figures[1]:8.2f}x | {figures[2]:8.2f}x {figures[3]:8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
