"""Vision against llama.cpp's own llama-server on the same files (a GGUF and its projector).

Agreement first: for a few pictures, the prompt's token count (image tokens included) and the
greedy reply llama-server gives through its Chat Completions route, against Shoal's in every
dialect (Chat Completions, Responses, Anthropic Messages, Ollama's /api/chat), each with the
picture before the question. Then speed, in interleaved pairs: time to first token with one
new picture (so neither server has it cached), the same question without a picture (the
difference is what the picture costs: its encoding and its positions' prefill), and a second
question about the picture just sent (a prefix-cache hit on both) against the first.

Both servers are started by tools/bench.sh; this only sends requests and prints figures.
"""
import argparse
import base64
import json
import random
import statistics
import struct
import time
import urllib.request
import zlib

QUESTION = "Describe this picture in one sentence."
FOLLOW_UP = "What colour is it mostly?"
MAX_TOKENS = 16


def png(width, height, seed):
    """A PNG of a gradient whose offsets come from `seed` (no imaging library needed)."""
    rng = random.Random(seed)
    a, b, c = (rng.randrange(256) for _ in range(3))
    rows = []
    for y in range(height):
        row = bytearray([0])
        for x in range(width):
            row += bytes(((x * 7 + a) % 256, (y * 5 + b) % 256, (x * y + c) % 256))
        rows.append(bytes(row))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
            + chunk(b"IEND", b""))


def post(url, body, stream=False):
    """POSTs JSON; returns the seconds to the first content (streamed) and the body (not streamed)."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        if not stream:
            return time.perf_counter() - t0, json.loads(r.read())
        first = None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            delta = (ev.get("choices") or [{}])[0].get("delta", {})
            if first is None and delta.get("content"):
                first = time.perf_counter() - t0
        return first, None


def chat_body(model, question, image, stream=False):
    content = [{"type": "text", "text": question}]
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": stream}


def shoal_dialects(base, model, image):
    """Shoal's greedy reply and prompt tokens to the picture and question, in each dialect."""
    b64 = base64.b64encode(image).decode()
    out = {}
    _, v = post(f"{base}/v1/chat/completions", chat_body(model, QUESTION, image))
    out["chat"] = (v["choices"][0]["message"]["content"], v["usage"]["prompt_tokens"],
                   v["usage"]["prompt_tokens_details"].get("image_tokens"))
    _, v = post(f"{base}/v1/responses", {
        "model": model, "max_output_tokens": MAX_TOKENS, "temperature": 0,
        "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64," + b64},
            {"type": "input_text", "text": QUESTION}]}]})
    text = "".join(c.get("text", "") for o in v["output"] for c in o.get("content", []))
    out["responses"] = (text, v["usage"]["input_tokens"], v["usage"]["input_tokens_details"].get("image_tokens"))
    _, v = post(f"{base}/v1/messages", {
        "model": model, "max_tokens": MAX_TOKENS, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": QUESTION}]}]})
    u = v["usage"]
    text = "".join(c.get("text", "") for c in v["content"])
    out["anthropic"] = (text, u["input_tokens"] + u.get("cache_read_input_tokens", 0)
                        + u.get("cache_creation_input_tokens", 0), None)
    _, v = post(f"{base}/api/chat", {
        "model": model, "stream": False, "options": {"temperature": 0, "num_predict": MAX_TOKENS},
        "messages": [{"role": "user", "content": QUESTION, "images": [b64]}]})
    out["ollama"] = (v["message"]["content"], v["prompt_eval_count"], v.get("prompt_eval_image_count"))
    return out


def reply_logprobs(base, model, image):
    """The logprob of each greedy reply token through Chat Completions: where the image's and the
    question's positions lie shows here before it shows in the words."""
    body = chat_body(model, QUESTION, image)
    body.update({"logprobs": True, "top_logprobs": 1})
    _, v = post(f"{base}/v1/chat/completions", body)
    return [t["logprob"] for t in ((v["choices"][0].get("logprobs") or {}).get("content") or [])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True, help="Shoal's base URL")
    ap.add_argument("--llama", required=True, help="llama-server's base URL")
    ap.add_argument("--model", required=True, help="the model's id on Shoal")
    ap.add_argument("--pairs", type=int, default=9, help="timed pairs; 0 checks agreement only")
    a = ap.parse_args()

    print("agreement with llama-server (greedy, the picture before the question):")
    agree = True
    for seed in range(3):
        image = png(64 + 16 * seed, 64, seed)
        _, ref = post(f"{a.llama}/v1/chat/completions", chat_body(a.model, QUESTION, image))
        want = (ref["choices"][0]["message"]["content"], ref["usage"]["prompt_tokens"])
        for dialect, (text, prompt, image_tokens) in shoal_dialects(a.shoal, a.model, image).items():
            same_text, same_prompt = text == want[0], prompt == want[1]
            agree &= same_text and same_prompt
            print(f"  picture {seed} {dialect:10s} prompt {prompt:4d} vs {want[1]:4d} ({'same' if same_prompt else 'DIFFERENT'}),"
                  f" image tokens {image_tokens if image_tokens is not None else '-'},"
                  f" reply {'same' if same_text else 'DIFFERENT: ' + repr(text) + ' vs ' + repr(want[0])}")
        # Printed, not judged: the two llama.cpp builds differ in the last bits of their kernels
        # (about 0.03 on Qwen2.5's Q4_K_M text alone), which random projector weights enlarge.
        ours, theirs = reply_logprobs(a.shoal, a.model, image), reply_logprobs(a.llama, a.model, image)
        gap = max((abs(x - y) for x, y in zip(ours, theirs)), default=float("nan"))
        print(f"  picture {seed} logprobs of the reply's tokens: largest difference {gap:.5f}")
    print(f"  every dialect agrees with llama-server: {'yes' if agree else 'NO'}")
    if a.pairs == 0:
        return

    # Each pair sends a picture neither server has seen (this run's own: Shoal's prefix cache
    # outlives a restart on its disk tier), in alternating order.
    run = random.SystemRandom().randrange(1 << 30)
    cold, text_only, again = {"shoal": [], "llama": []}, {"shoal": [], "llama": []}, {"shoal": [], "llama": []}
    servers = {"shoal": a.shoal, "llama": a.llama}
    for i in range(a.pairs):
        order = ["shoal", "llama"] if i % 2 == 0 else ["llama", "shoal"]
        image = png(64, 64, run + i)
        for name in order:
            url = f"{servers[name]}/v1/chat/completions"
            cold[name].append(post(url, chat_body(a.model, QUESTION, image, True), True)[0])
            again[name].append(post(url, chat_body(a.model, FOLLOW_UP, image, True), True)[0])
            text_only[name].append(post(url, chat_body(a.model, f"({run + i}) {QUESTION}", None, True), True)[0])
    med = {k: {n: statistics.median(x for x in v[n] if x is not None) for n in v} for k, v in
           (("cold", cold), ("text", text_only), ("again", again))}
    print(f"time to first token, median of {a.pairs} interleaved pairs (llama-server ÷ Shoal: above 1 is Shoal faster):")
    for k, label in (("cold", "one new picture"), ("text", "the question alone"),
                     ("again", "the same picture again (cache hit)")):
        s, l = med[k]["shoal"], med[k]["llama"]
        print(f"  {label:36s} Shoal {s * 1000:8.1f} ms   llama-server {l * 1000:8.1f} ms   ratio {l / s:5.2f}x")
    for n in ("shoal", "llama"):
        cost = med["cold"][n] - med["text"][n]
        print(f"  {n:6s}: the picture costs {cost * 1000:7.1f} ms; asked again it is {med['again'][n] / med['cold'][n]:5.2f}x"
              f" of the first time")


if __name__ == "__main__":
    main()
