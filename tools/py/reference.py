#!/usr/bin/env python3
"""Reference numbers from mlx-lm for comparing the engine against.

Usage:
    reference.py [MODEL_DIR] [--prompt TEXT]... [--token-ids 1,2,3]...
                 [--prompts-json FILE|-] [--max-tokens 32] [--top-k 20] [--step-top K]
                 [--no-full-logits] [--out FILE] [--no-openblas]

MODEL_DIR defaults to ${SHOAL_CACHE:-<repo>/.cache}/models/smollm2-135m-mlx-f32
(made by convert_gguf.py). Example:

    VENV="$(tools/setup-pyenv.sh)"
    "$VENV/bin/python" tools/py/reference.py --prompt "What is the capital of France?"

Prompts (any mix; results keep this order: --prompts-json entries, then
--prompt, then --token-ids):
  --prompt TEXT        one user message, rendered with the model's chat template
  --token-ids 1,2,3    raw prompt token ids (no template, nothing added)
  --prompts-json FILE  a JSON list whose items are one of
                         "text"                          -> one user message
                         [{"role": .., "content": ..}]   -> a message list
                         {"messages": [...]}             -> a message list
                         {"token_ids": [1, 2, 3]}        -> raw ids
                         {"text": "raw text"}            -> tokenized as is
                         {"text": "raw text", "add_special_tokens": true}
                                                         -> with the tokenizer's
                                                            own BOS/EOS, as
                                                            mlx_lm.generate
                                                            encodes raw text
                       (object items may carry an "id", copied to the result)
Message lists are rendered with the tokenizer's own chat template
(apply_chat_template, add_generation_prompt=True, tokenize=False) and the
rendered string is encoded with add_special_tokens=False, so special tokens in
the template text map to their ids and nothing else is prepended.

Output: one JSON object (stdout, or --out FILE):
  {
    "format": "shoal-reference-v1",
    "model_dir": str, "mlx": str, "mlx_lm": str,
    "device": str (mx.default_device()), "blas": "openblas" | "bundled",
    "dtype": str (embedding weight dtype, e.g. "float32"),
    "eos_token_ids": [int], "max_tokens": int, "top_k": int,
    "results": [
      {
        "id": any (from the prompts file, else the index),
        "kind": "messages" | "token_ids" | "text",
        "messages": [...]        (kind "messages" only),
        "prompt_text": str       (the rendered/decoded prompt),
        "prompt_ids": [int],
        "top_logits": [[id, logit], ...]   top_k entries, highest first
                                           (ties: lower id first),
        "logits": [float] * vocab          raw float32 logits (omitted with
                                           --no-full-logits),
        "greedy_ids": [int]      argmax continuation, at most max_tokens ids;
                                 ends with the EOS id when one was produced,
        "finish_reason": "stop" | "length",
        "greedy_text": str       decode(greedy_ids minus a final EOS),
        "greedy_logprobs": [float]   log-softmax of each chosen token,
        "greedy_margins": [float]    best minus second-best logit at each step
                                     (small values mark fragile argmaxes)
        "step_top": [[[id, logprob], ...], ...]  with --step-top K: the K
                                     best log-probabilities at each greedy
                                     step (highest first)
      }, ...
    ]
  }
"logits"/"top_logits" are those of the first position after the prompt, i.e.
the output at the last prompt position, from one full forward pass over the
prompt without a cache. The greedy continuation comes from mlx-lm's
generate_step (KV cache, argmax sampler), which does not stop by itself; this
script stops after the first EOS id. Floats are float32 values written in their
shortest round-tripping decimal form.

The process re-executes itself once with Debian's OpenBLAS preloaded (the
engine's BLAS), see shoal_blas.py; --no-openblas or SHOAL_PY_OPENBLAS=0 keeps
the wheel's bundled reference BLAS.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shoal_blas  # noqa: E402

shoal_blas.ensure_openblas("--no-openblas" not in sys.argv)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = Path(os.environ.get("SHOAL_CACHE") or ROOT / ".cache") / "models" / "smollm2-135m-mlx-f32"


def f32(x) -> float:
    """A float32 as the Python float of its shortest decimal."""
    import numpy as np

    return float(str(np.float32(x)))


def parse_ids(s: str) -> list[int]:
    ids = [int(t) for t in s.replace(",", " ").split()]
    if not ids:
        raise argparse.ArgumentTypeError("empty token id list")
    return ids


def collect_prompts(args) -> list[dict]:
    items = []
    if args.prompts_json:
        text = sys.stdin.read() if args.prompts_json == "-" else Path(args.prompts_json).read_text()
        for i, it in enumerate(json.loads(text)):
            if isinstance(it, str):
                items.append({"id": i, "kind": "messages", "messages": [{"role": "user", "content": it}]})
            elif isinstance(it, list):
                items.append({"id": i, "kind": "messages", "messages": it})
            elif isinstance(it, dict):
                pid = it.get("id", i)
                if "messages" in it:
                    items.append({"id": pid, "kind": "messages", "messages": it["messages"]})
                elif "token_ids" in it:
                    items.append({"id": pid, "kind": "token_ids", "token_ids": [int(t) for t in it["token_ids"]]})
                elif "text" in it:
                    special = bool(it.get("add_special_tokens", False))
                    items.append({"id": pid, "kind": "text", "text": it["text"], "add_special_tokens": special})
                else:
                    raise SystemExit(f"reference: prompt {i}: need messages, token_ids or text")
            else:
                raise SystemExit(f"reference: prompt {i}: unsupported item {it!r}")
    for p in args.prompt:
        items.append({"id": len(items), "kind": "messages", "messages": [{"role": "user", "content": p}]})
    for ids in args.token_ids:
        items.append({"id": len(items), "kind": "token_ids", "token_ids": ids})
    if not items:
        raise SystemExit("reference: no prompts (use --prompt, --token-ids or --prompts-json)")
    return items


def run_one(model, tokenizer, item: dict, args, eos: set[int]) -> dict:
    import mlx.core as mx
    import numpy as np
    from mlx_lm.generate import generate_step

    hf = tokenizer._tokenizer
    out = {"id": item["id"], "kind": item["kind"]}
    if item["kind"] == "messages":
        out["messages"] = item["messages"]
        text = hf.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=False)
        ids = list(hf.encode(text, add_special_tokens=False))
    elif item["kind"] == "text":
        text = item["text"]
        ids = list(hf.encode(text, add_special_tokens=item["add_special_tokens"]))
    else:
        ids = item["token_ids"]
        text = hf.decode(ids)
    if not ids:
        raise SystemExit(f"reference: prompt {item['id']} has no tokens")
    out["prompt_text"] = text
    out["prompt_ids"] = ids

    logits = model(mx.array(ids)[None])[0, -1].astype(mx.float32)
    mx.eval(logits)
    lv = np.array(logits)
    order = np.lexsort((np.arange(lv.size), -lv))[: args.top_k]
    out["top_logits"] = [[int(i), f32(lv[i])] for i in order]
    if args.full_logits:
        out["logits"] = [f32(v) for v in lv]

    gen_ids, lps, margins, step_top = [], [], [], []
    finish = "length"
    for tok, logprobs in generate_step(mx.array(ids), model, max_tokens=args.max_tokens):
        top2 = mx.sort(mx.topk(logprobs, 2))
        mx.eval(top2)
        gen_ids.append(int(tok))
        lps.append(f32(logprobs[int(tok)].item()))
        margins.append(f32(top2[1].item() - top2[0].item()))
        if args.step_top:
            lp = np.array(logprobs.astype(mx.float32))
            best = np.lexsort((np.arange(lp.size), -lp))[: args.step_top]
            step_top.append([[int(i), f32(lp[i])] for i in best])
        if int(tok) in eos:
            finish = "stop"
            break
    body = gen_ids[:-1] if finish == "stop" else gen_ids
    out["greedy_ids"] = gen_ids
    out["finish_reason"] = finish
    out["greedy_text"] = hf.decode(body)
    out["greedy_logprobs"] = lps
    out["greedy_margins"] = margins
    if args.step_top:
        out["step_top"] = step_top
    if gen_ids and gen_ids[0] != int(order[0]):
        print(
            f"reference: note: prompt {item['id']}: cached greedy token {gen_ids[0]} "
            f"differs from the full-forward argmax {int(order[0])}",
            file=sys.stderr,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="mlx-lm reference logits and greedy output (see module docstring)")
    ap.add_argument("model_dir", type=Path, nargs="?", default=DEFAULT_MODEL)
    ap.add_argument("--prompt", action="append", default=[], help="one user message (chat template applied)")
    ap.add_argument("--token-ids", action="append", default=[], type=parse_ids, help="raw ids, e.g. 1,2,3")
    ap.add_argument("--prompts-json", help="JSON file with a list of prompts ('-' for stdin)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--no-full-logits", dest="full_logits", action="store_false")
    ap.add_argument("--step-top", type=int, default=0, help="record the K best logprobs of each greedy step")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--no-openblas", action="store_true", help="keep the wheel's bundled BLAS")
    args = ap.parse_args()
    items = collect_prompts(args)

    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten
    from mlx_lm import load

    from mlx_compat import compat_gather_qmm

    compat_gather_qmm()
    model, tokenizer = load(str(args.model_dir))
    eos = set(int(t) for t in tokenizer.eos_token_ids)
    result = {
        "format": "shoal-reference-v1",
        "model_dir": str(args.model_dir.resolve()),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "blas": shoal_blas.blas_in_use(),
        "dtype": str(tree_flatten(model.parameters())[0][1].dtype).replace("mlx.core.", ""),
        "eos_token_ids": sorted(eos),
        "max_tokens": args.max_tokens,
        "top_k": args.top_k,
        "results": [run_one(model, tokenizer, it, args, eos) for it in items],
    }
    text = json.dumps(result, ensure_ascii=False)
    if args.out:
        tmp = f"{args.out}.tmp-{os.getpid()}"
        Path(tmp).write_text(text + "\n")
        os.replace(tmp, args.out)
    else:
        sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
