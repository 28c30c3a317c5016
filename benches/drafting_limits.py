"""Where a copying drafter loses on an agentic stream: choosing what to draft, or how much.

`pocket bench` reports the bound no copying drafter can beat (an oracle drafting the longest
run it finds). This script asks the next question, by replaying the stream's `off` answers
through simplified models of pocketd's suffix drafter (stdlib only; the models are close to,
not the same as, `crates/pocket-core/src/spec/suffix_drafter.rs` and `history.rs`):

- candidates: what followed the latest occurrence of the longest suffix of the request's own
  text (prompt and answer so far), and the path of most frequent continuations of the longest
  suffix found in the app's earlier answers (each after its prompt's last 8 tokens);
- `pocketd`: each candidate's tokens valued by acceptance learned online per match-length
  bucket (the history's times each token's share), the pass sized by the cost curve's
  expected speed-up, the better candidate drafted;
- `no-history`: the same without earlier answers;
- `oracle-choice`: `pocketd`'s sizing, but the candidate that turns out right is taken;
- `oracle-length`: `pocketd`'s choice, but each draft is exactly as long as it turns out
  right (nothing where its first token is wrong);
- `calibrated`: acceptance read from a table of what happened on this very stream (in
  sample, so optimistic) by match length, occurrences and share: what better estimates from
  these features could reach.

    python3 benches/drafting_limits.py collect --socket S --model M --out answers.json
    python3 benches/drafting_limits.py simulate answers.json --cost "1 1.26 1.51 ..."

`collect` replays `benches/agentic.jsonl` (or `--prompts FILE`) greedily with `spec: off` and
keeps each answer's and prompt's tokens; `--cost` is the curve `pocket bench` prints (steps
for passes of 1, 2, ... tokens). Figures are speed-ups over plain decoding, in steps.
"""

import argparse
import http.client
import json
import socket
from collections import Counter, defaultdict

SEPARATOR = -1
PROMPT_TAIL = 8
MAX_DRAFT = 15
BUCKETS = [1, 2, 4, 8, 16, 10**9]
PRIORS = [0.2, 0.35, 0.5, 0.65, 0.75, 0.85]
RECALLED_PRIORS = [0.1, 0.25, 0.45, 0.6, 0.75, 0.85]


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("pocketd")
        self.path_ = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path_)


def post(sock: str, url: str, body: dict) -> dict:
    c = UnixHTTP(sock)
    c.request("POST", url, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit(f"{url}: {r.status} {data[:300]!r}")
    return json.loads(data)


def collect(args) -> None:
    out = []
    for line in open(args.prompts):
        q = json.loads(line)
        body = {"model": args.model, "messages": q["messages"], "max_tokens": q.get("max_tokens", 256)}
        a = post(args.socket, "/v1/chat/completions", {**body, "temperature": 0, "spec": "off", "return_tokens": True})
        p = post(args.socket, "/tokenize", {"model": args.model, "messages": q["messages"]})["tokens"]
        prompt = [t if isinstance(t, int) else t["id"] for t in p]
        out.append({"id": q["id"], "app": q["app"], "prompt": prompt, "answer": a["tokens"]})
        print(q["id"], len(a["tokens"]), "tokens")
    json.dump(out, open(args.out, "w"))


def bucket(n: int) -> int:
    return next(i for i, b in enumerate(BUCKETS) if n <= b)


class Estimate:
    """Acceptance per drafted token from decayed counts, as pocketd's AcceptanceEstimate."""

    def __init__(self, alpha: float, weight: float = 4.0):
        self.accepted, self.rejected = alpha * weight, (1 - alpha) * weight

    def alpha(self) -> float:
        return self.accepted / max(self.accepted + self.rejected, 1e-9)

    def update(self, drafted: int, accepted: int) -> None:
        self.accepted = self.accepted * 0.95 + accepted
        self.rejected = self.rejected * 0.95 + (accepted < drafted)


def best_path(p: list, cost: list) -> tuple:
    """The draft length with the best expected tokens per step, and that speed-up."""
    expected, reach, best = 1.0, 1.0, (0, 1.0)
    for i, pi in enumerate(p[: len(cost) - 1]):
        reach *= min(max(pi, 0.0), 1.0)
        expected += reach
        gain = expected / cost[i + 1]
        if gain > best[1]:
            best = (i + 1, gain)
    return best


def longest(seqs: list, known: list, most: int = 40) -> tuple:
    """The longest suffix of `known` that occurs in `seqs` with a token after it, and where."""
    found = (0, [])
    for n in range(1, min(most, len(known)) + 1):
        pattern = known[-n:]
        at = [(i, e) for i, s in enumerate(seqs) for e in range(n, len(s)) if s[e - n : e] == pattern]
        if not at:
            break
        found = (n, at)
    return found


def frequent_path(seqs: list, at: list) -> tuple:
    """From occurrences `at`, the most frequent continuation token by token: the tokens, each
    one's share of the occurrences so far, and how many occurrences there were before it."""
    path, share, support = [], [], []
    while at and len(path) < MAX_DRAFT:
        token, count = Counter(seqs[i][e] for i, e in at).most_common(1)[0]
        if token == SEPARATOR:
            break
        path.append(token)
        share.append(count / len(at))
        support.append(len(at))
        at = [(i, e + 1) for i, e in at if seqs[i][e] == token and e + 1 < len(seqs[i])]
    return path, share, support


def agree(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def feature(length: int, support: int, share: float) -> tuple:
    group = lambda n: n if n <= 4 else (8 if n <= 8 else 16)
    return (group(length), min(support, 4), round(share, 1))


def candidates(known: list, history: list) -> tuple:
    own = history_path = None
    n, at = longest([known], known)
    if n:
        _, e = max(at, key=lambda x: x[1])
        own = (n, known[e : e + MAX_DRAFT])
    m, at = longest(history, known) if history else (0, [])
    if m:
        history_path = (m, *frequent_path(history, at))
    return own, history_path


def calibration(data: list) -> dict:
    """Per feature of a history token: how often it was right, on this stream."""
    seen = defaultdict(lambda: [0, 0])
    earlier = {}
    for r in data:
        history = earlier.setdefault(r["app"], [])
        for t in range(1, len(r["answer"])):
            known, truth = r["prompt"] + r["answer"][:t], r["answer"][t:]
            _, h = candidates(known, history)
            if h:
                m, path, share, support = h
                for j, token in enumerate(path):
                    right = j < len(truth) and token == truth[j]
                    counts = seen[feature(m + j, support[j], share[j])]
                    counts[0] += 1
                    counts[1] += right
                    if not right:
                        break
        history.append(r["prompt"][-PROMPT_TAIL:] + r["answer"] + [SEPARATOR])
    return {k: right / n for k, (n, right) in seen.items()}


def simulate(data: list, cost: list, policy: str, table: dict) -> list:
    """Per answer: tokens after the first, and the steps the policy took for them."""
    earlier, learned, out = {}, {}, []
    for r in data:
        history = earlier.setdefault(r["app"], [])
        recalled = learned.setdefault(r["app"], [Estimate(p) for p in RECALLED_PRIORS])
        own_est = [Estimate(p) for p in PRIORS]
        answer, prompt = r["answer"], r["prompt"]
        t, steps = 1, 0.0
        while t < len(answer):
            known, truth = prompt + answer[:t], answer[t:]
            own, h = candidates(known, [] if policy == "no-history" else history)
            options = []
            if own:
                n, path = own
                k, gain = best_path([own_est[bucket(n)].alpha()] * len(path), cost)
                options.append((gain, k, path, own_est[bucket(n)]))
            if h:
                m, path, share, support = h
                est = recalled[bucket(m)]
                if policy == "calibrated":
                    p = [table.get(feature(m + j, support[j], share[j]), 0.3) for j in range(len(path))]
                else:
                    p = [est.alpha() * s for s in share]
                k, gain = best_path(p, cost)
                options.append((gain, k, path, est))
            if not options:
                steps, t = steps + 1, t + 1
                continue
            if policy == "oracle-choice":
                gain, k, path, est = max(options, key=lambda o: (agree(o[2], truth), o[0]))
            else:
                gain, k, path, est = max(options, key=lambda o: o[0])
            if policy == "oracle-length":
                k = agree(path, truth)
            if k == 0 or (policy != "oracle-length" and gain <= 1.0):
                steps, t = steps + 1, t + 1
                continue
            draft = path[: min(k, len(cost) - 1)]
            kept = agree(draft, truth)
            steps += cost[len(draft)]
            est.update(len(draft), kept)
            t += kept + 1
        out.append((len(answer) - 1, steps))
        history.append(prompt[-PROMPT_TAIL:] + answer + [SEPARATOR])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--socket", required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--prompts", default="benches/agentic.jsonl")
    c.add_argument("--out", required=True)
    s = sub.add_parser("simulate")
    s.add_argument("answers")
    s.add_argument("--cost", required=True, help="steps for passes of 1, 2, ... tokens")
    args = parser.parse_args()
    if args.command == "collect":
        return collect(args)
    data = json.load(open(args.answers))
    cost = [float(x) for x in args.cost.split()]
    table = calibration(data)
    half = len(data) // 2
    speedup = lambda part: sum(a for a, _ in part) / sum(b for _, b in part)
    print(f"{'policy':<14} {'first half':>10} {'second half':>11} {'all':>6}")
    for policy in ["no-history", "pocketd", "oracle-choice", "calibrated", "oracle-length"]:
        r = simulate(data, cost, policy, table)
        print(f"{policy:<14} {speedup(r[:half]):>9.2f}x {speedup(r[half:]):>10.2f}x {speedup(r):>5.2f}x")


if __name__ == "__main__":
    main()
