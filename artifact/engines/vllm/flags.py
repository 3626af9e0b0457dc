"""Run with vLLM's own interpreter (not the artifact's): parses `vllm serve` arguments with that vLLM's own parser and
prints one JSON line with what they set. No server, no GPU: a flag this vLLM does not know, or a value it refuses,
is an error exit, so the adapter's flags are checked against the installed version before any server starts
(`scripts/vllm-gpu.sh check`; tests/engines/test_vllm_flags.py for 0.11.0). Standalone on purpose: it imports
nothing of the artifact.

    python flags.py serve MODEL_DIR --host ... [the adapter's serve arguments]
"""

import json
import sys

KEYS = (
    "model_tag",
    "host",
    "served_model_name",
    "seed",
    "max_num_seqs",
    "generation_config",
    "enable_prompt_tokens_details",
    "kv_cache_dtype",
    "max_model_len",
    "max_num_batched_tokens",
    "dtype",
    "enable_prefix_caching",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "enable_chunked_prefill",
    "disable_cascade_attn",
    "block_size",
    "prefix_caching_hash_algo",
    "disable_log_stats",
    "enforce_eager",
    "attention_backend",
    "attention_config",
)


def main() -> None:
    import vllm
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # 0.25.0
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # 0.11.0

    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    print(
        json.dumps({"vllm": vllm.__version__, **{k: getattr(args, k, None) for k in KEYS}}, default=str, sort_keys=True)
    )


if __name__ == "__main__":
    main()
