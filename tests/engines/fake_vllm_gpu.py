"""FAKE vLLM 0.25.0 GPU server, for tests only: it stands in for what cannot run here (vLLM's CUDA build on a GPU)
and answers the HTTP API the vLLM adapter uses, shaped as vLLM 0.25.0's own source shapes it (the wheel's
entrypoints/openai/completion/{protocol,serving}.py, v1/metrics/loggers.py, platforms/cuda.py). No model, no GPU,
no tokenizer: a "token" is 4 characters of the prompt.

    fake_vllm_gpu.py serve MODEL_DIR --host H --port P [vllm serve flags ...]

What it imitates, because the adapter reads it: the start-up log lines naming the attention backend; /health,
/version, /tokenize, /metrics (prefix-cache counters, request prefill/decode time, vllm:cache_config_info with the
served enable_prefix_caching); /v1/completions with `return_tokens_as_token_ids` keys, top-2 `top_logprobs`,
`token_ids`, `usage.prompt_tokens_details.cached_tokens` (0 on a miss, as 0.25.0) and `cache_salt`. Its prefix cache
holds full 16-token blocks chained by hash, the first block salted by `cache_salt` (v1/core/kv_cache_utils.py); a
hit is capped so that one prompt token is always computed. Its "numerics": a request served with cached tokens
answers differently from the same request recomputed (the cached path's other reduction order, in caricature),
unless VLLM_BATCH_INVARIANT=1 (then both paths answer alike). Standalone: it imports nothing of the artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCK = 16
VERSION = "0.25.0"


def tokens_of(text: str) -> list[int]:
    return [
        int.from_bytes(hashlib.sha256(text[i : i + 4].encode()).digest()[:2], "big") for i in range(0, len(text), 4)
    ]


class State:
    def __init__(self, caching: bool, batch_invariant: bool, max_model_len: int):
        self.caching, self.batch_invariant, self.max_model_len = caching, batch_invariant, max_model_len
        self.blocks: set[str] = set()
        self.queries = self.hits = 0
        self.prefill_s = self.decode_s = 0.0
        self.requests = 0
        self.lock = threading.Lock()

    def lookup_and_insert(self, ids: list[int], salt: str | None) -> int:
        """Cached prompt tokens of a request (then its full blocks are cached), as vLLM's block pool would."""
        if not self.caching:
            return 0
        chain, hashes = salt or "", []
        for i in range(0, len(ids) - len(ids) % BLOCK, BLOCK):
            chain = hashlib.sha256(f"{chain}|{ids[i : i + BLOCK]}".encode()).hexdigest()
            hashes.append(chain)
        hit = 0
        for h in hashes:
            if h not in self.blocks:
                break
            hit += 1
        cached = min(hit * BLOCK, BLOCK * ((len(ids) - 1) // BLOCK))
        self.blocks.update(hashes)
        self.queries += len(ids)
        self.hits += cached
        return cached


def metrics(state: State) -> str:
    lab = f'engine="0",model_name="{MODEL_NAME}"'
    return "\n".join(
        [
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{{{lab}}} {float(state.queries)}",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{{{lab}}} {float(state.hits)}",
            "# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.",
            "# TYPE vllm:request_prefill_time_seconds histogram",
            f"vllm:request_prefill_time_seconds_sum{{{lab}}} {state.prefill_s}",
            f"vllm:request_prefill_time_seconds_count{{{lab}}} {float(state.requests)}",
            "# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.",
            "# TYPE vllm:request_decode_time_seconds histogram",
            f"vllm:request_decode_time_seconds_sum{{{lab}}} {state.decode_s}",
            f"vllm:request_decode_time_seconds_count{{{lab}}} {float(state.requests)}",
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{BLOCK}",cache_dtype="auto",enable_prefix_caching='
            f'"{state.caching}",engine="0"}} 1.0',
            "",
        ]
    )


def completion(state: State, req: dict) -> tuple[int, dict]:
    prompt, salt = req.get("prompt"), req.get("cache_salt")
    if not isinstance(prompt, str):
        return 400, {"error": {"message": "this fake takes string prompts only", "code": 400}}
    if salt is not None and (not isinstance(salt, str) or not salt):
        return 400, {
            "error": {"message": "Parameter 'cache_salt' must be a non-empty string if provided.", "code": 400}
        }
    ids = tokens_of(prompt)
    if len(ids) + 1 > state.max_model_len:
        return 400, {
            "error": {"message": f"This model's maximum context length is {state.max_model_len} tokens", "code": 400}
        }
    with state.lock:
        cached = state.lookup_and_insert(ids, salt)
        state.requests += 1
        # server times vary from run to run, as a real server's do (records with identical timings are copies)
        state.prefill_s += 0.002 + random.random() * 1e-4
        state.decode_s += 0.01 + random.random() * 1e-4
    path = "cached" if cached and not state.batch_invariant else "recomputed"
    text = f"fake reply to {hashlib.sha256(prompt.encode()).hexdigest()[:8]} ({path})"[: 4 * int(req["max_tokens"])]
    out = tokens_of(text)
    gap = 2.25 if path == "recomputed" else 2.0
    tops = [{f"token_id:{t}": -0.25, f"token_id:{(t + 1) % 65536}": -0.25 - gap} for t in out]
    body = {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": 0,
        "model": req.get("model"),
        "choices": [
            {
                "index": 0,
                "text": text,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": out if req.get("return_token_ids") else None,
                "prompt_token_ids": None,
                "logprobs": {
                    "text_offset": list(range(0, 4 * len(out), 4)),
                    "token_logprobs": [-0.25] * len(out),
                    "tokens": [f"token_id:{t}" for t in out],
                    "top_logprobs": tops,
                },
            }
        ],
        "usage": {
            "prompt_tokens": len(ids),
            "completion_tokens": len(out),
            "total_tokens": len(ids) + len(out),
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }
    return 200, body


def main() -> None:
    global MODEL_NAME
    args = sys.argv[1:]
    if not args or args[0] != "serve":
        sys.exit("usage: fake_vllm_gpu.py serve MODEL_DIR --host H --port P ...")

    def opt(name, default=None):
        return args[args.index(name) + 1] if name in args else default

    MODEL_NAME = opt("--served-model-name", args[1])
    caching = "--enable-prefix-caching" in args and "--no-enable-prefix-caching" not in args
    bi = os.environ.get("VLLM_BATCH_INVARIANT") == "1"
    state = State(caching, bi, int(opt("--max-model-len", "8192")))
    print(
        f"INFO fake vLLM {VERSION} GPU server (tests/engines/fake_vllm_gpu.py): no model, no GPU; args {args}",
        flush=True,
    )
    if bi:
        print("WARNING [vllm.py:1457] Disabling cascade attention when VLLM_BATCH_INVARIANT is enabled.", flush=True)
    # the backend and FlashAttention version a plan asks for (--attention-config), else vLLM's own choice on Hopper
    attention = json.loads(opt("--attention-config", "{}"))
    backend = attention.get("backend", "FLASH_ATTN")
    print(
        f"INFO [cuda.py:476] Using {backend} attention backend out of potential backends: ['FLASH_ATTN', "
        "'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].",
        flush=True,
    )
    print(f"INFO [selector.py:135] Using NHD KV cache layout for {backend} backend.", flush=True)
    if backend == "FLASH_ATTN":
        print(
            f"INFO [flash_attn.py:718] Using FlashAttention version {attention.get('flash_attn_version', 3)}",
            flush=True,
        )
    if "--enforce-eager" in args:
        print("INFO [model.py:1234] Enforce eager set, disabling torch.compile and CUDAGraphs.", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # one line per request, on stdout (the server log)
            print("INFO fake access " + (a[0] % a[1:]), flush=True)

        def send(self, code: int, body, ctype="application/json"):
            data = (json.dumps(body) if ctype == "application/json" else body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.send(200, "", "text/plain")
            elif self.path == "/version":
                self.send(200, {"version": VERSION})
            elif self.path == "/metrics":
                self.send(200, metrics(state), "text/plain; version=0.0.4")
            else:
                self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/tokenize":
                ids = tokens_of(req.get("prompt", ""))
                self.send(200, {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids})
            elif self.path == "/v1/completions":
                self.send(*completion(state, req))
            else:
                self.send(404, {"detail": "Not Found"})

    ThreadingHTTPServer((opt("--host", "127.0.0.1"), int(opt("--port"))), Handler).serve_forever()


MODEL_NAME = "fake"

if __name__ == "__main__":
    main()
