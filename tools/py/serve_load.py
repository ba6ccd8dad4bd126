"""Aggregate decode under the same HTTP load on two servers: `shoal serve` (/v1/completions)
and llama.cpp's `llama-server --parallel 8` (/completion). Each round sends 8 concurrent greedy
requests of 64 tokens after distinct 100-token prompts and measures every completion token over
the round's wall time (prefill included). Rounds alternate which server goes first; prints each
round and the median ratio.

Neither server may end a reply early: llama-server gets `ignore_eos`, Shoal a logit_bias that
bans the file's control tokens (or, for a vocabulary with thousands of them, the ends it names)."""
import argparse
import json
import statistics
import threading
import time
import urllib.request

import gguf


def bans(path):
    r = gguf.GGUFReader(path)
    types = r.fields["tokenizer.ggml.token_type"].contents()
    control = [i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL]
    if len(control) <= 300:
        return control
    named = []
    for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if k in r.fields:
            named.append(int(r.fields[k].contents()))
    return named


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--model", required=True, help="the GGUF both servers run")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    model_id = post_get(f"{a.shoal}/v1/models")["data"][0]["id"]
    bias = {str(t): -100 for t in bans(a.model)}
    n_vocab = len(gguf.GGUFReader(a.model).fields["tokenizer.ggml.tokens"].contents())
    span = max(n_vocab // 2, 1000)

    def prompt(rnd, i):
        return [(rnd * 7919 + i * 104729 + k * 31 + 13) % span + 100 for k in range(100)]

    def shoal(p):
        v = post(f"{a.shoal}/v1/completions",
                 {"model": model_id, "prompt": p, "max_tokens": 64, "temperature": 0, "logit_bias": bias})
        return v["usage"]["completion_tokens"]

    def llama(p):
        v = post(f"{a.llama}/completion",
                 {"prompt": p, "n_predict": 64, "temperature": 0, "ignore_eos": True, "cache_prompt": False})
        return v["tokens_predicted"]

    def run(fn, rnd):
        out = [0] * 8

        def one(i):
            out[i] = fn(prompt(rnd, i))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return sum(out) / (time.perf_counter() - t), sum(out)

    run(shoal, 999)
    run(llama, 999)
    ratios = []
    for rnd in range(a.rounds):
        if rnd % 2 == 0:
            (s, sn), (l, ln) = run(shoal, rnd), run(llama, rnd)
        else:
            (l, ln), (s, sn) = run(llama, rnd), run(shoal, rnd)
        ratios.append(s / l)
        print(f"  round {rnd}: shoal {s:6.1f} tok/s ({sn} tokens)  llama-server {l:6.1f} tok/s ({ln} tokens)"
              f"  {s / l:.2f}x", flush=True)
    print(f"  8 streams over HTTP, shoal / llama-server --parallel 8: median {statistics.median(ratios):.2f}x")


def post_get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


if __name__ == "__main__":
    main()
