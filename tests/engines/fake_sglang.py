"""FAKE SGLang server, for tests only: it stands in for an SGLang deployment (which needs a GPU and its own
environment), so that the walkthrough in docs/extending.md can be run here end to end. No model and no tokenizer:
a "token" is 4 characters of the prompt.

    fake_sglang.py --model-path PATH --host H --port P [--disable-radix-cache] [--random-seed N]
                   [--context-length N] [--enable-cache-report]

What it answers, in the dialect the artifact's shared OpenAI client reads (artifact/engines/openai_client.py,
`parse_completion`): GET /health; POST /tokenize ({"tokens": [...]}); POST /v1/completions with
`choices[0].token_ids`, top-2 `logprobs.top_logprobs` keyed "token_id:N", and `usage.prompt_tokens_details
.cached_tokens` (with --enable-cache-report). Its "radix cache" (off with --disable-radix-cache) matches the longest
prefix of any earlier request's prompt and output, capped so that one prompt token is always computed; a request
served with cached tokens answers differently from the same request recomputed (the cached path's other reduction
order, in caricature). Standalone: it imports nothing of the artifact.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def tokens_of(text: str) -> list[int]:
    return [
        int.from_bytes(hashlib.sha256(text[i : i + 4].encode()).digest()[:2], "big") for i in range(0, len(text), 4)
    ]


def common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class State:
    def __init__(self, radix: bool, seed: int, context: int, report: bool):
        self.radix, self.seed, self.context, self.report = radix, seed, context, report
        self.seen: list[list[int]] = []


def generate(state: State, prompt: list[int], n: int, cached: int) -> list[int]:
    digest = hashlib.sha256(json.dumps([state.seed, prompt]).encode()).digest()
    flip = cached > 0 and digest[0] % 2 == 0  # the cached path's other numerics, on half the prompts
    out, h = [], digest
    for i in range(n):
        h = hashlib.sha256(h + bytes([i % 256, flip])).digest()
        out.append(1000 + h[0] % 64)
    return out


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # the server's log: one line per request on stderr
            print("FAKE SGLang:", fmt % args, file=sys.stderr, flush=True)

        def reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self.reply(200, {})
            return self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/tokenize":
                return self.reply(200, {"tokens": tokens_of(str(body.get("prompt", "")))})
            if self.path != "/v1/completions":
                return self.reply(404, {"detail": "Not Found"})
            prompt = tokens_of(str(body.get("prompt", "")))
            if len(prompt) > state.context:
                message = (
                    f"The input ({len(prompt)} tokens) is longer than the model's context length "
                    f"({state.context} tokens)."
                )
                return self.reply(400, {"object": "error", "message": message, "type": "BadRequestError"})
            cached = 0
            if state.radix:
                cached = min(max((common(prompt, s) for s in state.seen), default=0), len(prompt) - 1)
            n = int(body.get("max_tokens") or 16)
            out = generate(state, prompt, n, cached)
            state.seen.append(prompt + out)
            top = [{f"token_id:{t}": -0.1, f"token_id:{t + 100}": -3.0} for t in out]
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
            if state.report:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            choice = {
                "index": 0,
                "text": "".join(f" w{t % 64}" for t in out),
                "token_ids": out,
                "logprobs": {"tokens": [f"token_id:{t}" for t in out], "top_logprobs": top},
                "finish_reason": "length",
                "matched_stop": None,
            }
            return self.reply(200, {"id": "fake", "object": "text_completion", "choices": [choice], "usage": usage})

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--disable-radix-cache", action="store_true")
    ap.add_argument("--random-seed", type=int, default=0)
    ap.add_argument("--context-length", type=int, default=8192)
    ap.add_argument("--enable-cache-report", action="store_true")
    a, _ = ap.parse_known_args()
    state = State(not a.disable_radix_cache, a.random_seed, a.context_length, a.enable_cache_report)
    print(f"FAKE SGLang serving {a.model_path} on {a.host}:{a.port}", file=sys.stderr, flush=True)
    ThreadingHTTPServer((a.host, a.port), make_handler(state)).serve_forever()


if __name__ == "__main__":
    main()
