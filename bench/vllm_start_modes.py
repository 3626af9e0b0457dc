"""How long the vLLM CPU server of the test configuration (tests/budget.py: float32) takes to start and to serve,
compiled (vLLM's default, torch.compile) or eager (`--enforce-eager`): the measurement behind the tests' eager mode.

    PYTHONPATH=.:tests ARTIFACT_VLLM_VENV=... .venv/bin/python bench/vllm_start_modes.py eager|compiled

Prints the seconds to ready, of a first and a second request (a ~1.5k-token prompt, 12 tokens, OFF arm), the tokens
and the first position's top-2 log-probabilities (so that two modes' numerics can be compared)."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

from artifact.catalog import load_plan
from artifact.engines import get
from artifact.models import verified_weights
from budget import vllm_test_config

mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
cfg = vllm_test_config()
args = [a for a in cfg.server.extra_args if a != "--enforce-eager"] + (["--enforce-eager"] if mode == "eager" else [])
cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, extra_args=tuple(args)))
session = get(cfg.engine.kind).open_session(
    cfg, load_plan("main"), "off", verified_weights(cfg.model), Path(tempfile.mkdtemp()) / "server.log"
)
t0 = time.time()
session.start()
t1 = time.time()
prompt = "Hello " * 1500
first = session.complete(prompt, 12, cache_prompt=False)
t2 = time.time()
second = session.complete(prompt, 12, cache_prompt=False)
t3 = time.time()
session.stop()
print(
    f"{mode}: start {t1 - t0:.1f} s, first request {t2 - t1:.1f} s, second {t3 - t2:.1f} s; tokens {first.tokens} "
    f"(second the same: {first.tokens == second.tokens}); top-2 at 0: {first.top_logprobs[0][:2]}"
)
