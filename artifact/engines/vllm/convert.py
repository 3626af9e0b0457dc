"""Convert a configuration's GGUF for vLLM once (or reuse the converted directory) and check it against its pin
(artifact/engines/vllm/conversions.json); with --pin, write its files' sha256 as the pin of this converter.

    python -m artifact.engines.vllm.convert CONFIG... [--pin]
"""

from __future__ import annotations

import argparse
import json
import sys

from artifact.config import read_config
from artifact.engines.vllm.adapter import ENGINE
from artifact.engines.vllm.env import model_dir, resolve_executable, write_pin
from artifact.errors import ArtifactError
from artifact.models import verified_weights


def main(argv: list[str] | None = None) -> int:
    """Convert a configuration's GGUF for vLLM (or reuse the converted directory) and check it against its pin;
    with --pin, write its files' sha256 as the pin of this converter."""
    ap = argparse.ArgumentParser(prog="python -m artifact.engines.vllm.convert", description=main.__doc__)
    ap.add_argument("configs", nargs="+", help="configurations (engine.kind = vllm, a GGUF model)")
    ap.add_argument("--pin", action="store_true", help="write the conversion's files into conversions.json")
    args = ap.parse_args(argv)
    try:
        for name in args.configs:
            cfg = read_config(name)
            if cfg.engine.kind != ENGINE.kind:
                raise ArtifactError(f"{cfg.path}: engine.kind = {cfg.engine.kind!r}; this converts for {ENGINE.kind}")
            ENGINE.settings(cfg)
            exe = resolve_executable(cfg.engine.binary)
            directory, record = model_dir(
                verified_weights(cfg.model), cfg.model.sha256, cfg.model.quant, exe, check_pin=not args.pin
            )
            if args.pin:
                write_pin(record, cfg.model.source)
                record = {**record, "pin": {**record["pin"], "pinned": True}}
            print(
                json.dumps(
                    {
                        "config": cfg.name,
                        "dir": str(directory),
                        "pin": record["pin"],
                        "files_sha256": record["files_sha256"],
                    },
                    indent=1,
                )
            )
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
