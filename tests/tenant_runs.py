"""Synthetic runs of a tenant plan (background tenants' load recorded in the manifest), shared by the analysis and
the checker's tests: the load record artifact/protocol/background_tenants.py writes, its pairing inputs, and a plan
of four runs written through the real RunWriter (synthetic_runs.write_bfcl_run)."""

from __future__ import annotations

import hashlib

from synthetic_runs import MODEL, pairing_inputs, write_bfcl_run

SPEC = {"count": 1, "prefix": "shared", "prompts": 4, "n_predict": 32}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def units(shared: int, episodes=("e0", "e1", "e2", "e3")) -> list[dict]:
    """The tenant prompts a manifest records per measured unit (artifact.protocol.background_tenants.prepare): the
    unit's first prompt as the synthetic runs send it (`write_bfcl_run`: "e0/0"), 4 tenant prompts sharing `shared` of
    its 1000 characters each."""
    return [
        {
            "unit": e,
            "first_prompt_sha256": sha(f"{e}/0"),
            "first_prompt_chars": 1000,
            "prompts_sha256": [sha(f"{e}/tenant/{k}") for k in range(4)],
            "prompt_chars": [1200] * 4,
            "shared_prefix_chars": [shared] * 4,
        }
        for e in episodes
    ]


def load_record(spec=SPEC, overlapped=2, requests=2, completed=7, failed=0, shared=None) -> dict:
    """A manifest's `tenants` as artifact/protocol/background_tenants.py writes it at the end of a run; its tenant
    prompts share `shared` characters of each unit's first 1000 (default: 990 for a "shared" spec, 0 for an "unshared"
    one)."""
    shared = (990 if spec.get("prefix") == "shared" else 0) if shared is None else shared
    return {
        "spec": spec,
        "slots": 3,
        "generator": "artifact.protocol.tenants v1",
        "prompts_sha256": "aa" * 32,
        "units": units(shared),
        "sent": {
            "requests": completed + failed,
            "completed": completed,
            "failed": failed,
            "prompt_tokens": 700,
            "cache_n": 600,
            "prompt_n": 100,
            "predicted_n": 224,
        },
        "measured": {
            "requests": requests,
            "overlapped": overlapped,
            "seconds": 10.0,
            "overlap_s": 6.0,
            "overlap_share": 0.6,
        },
    }


def loaded_inputs(spec=SPEC, **changes) -> dict:
    """The pairing inputs of a tenant plan: the baseline's, with -np 3, -c 3 x ctx and the load."""
    return pairing_inputs(
        MODEL,
        8192,
        **{
            "server_args": ["-c", "12288", "-np", "3", "--cache-ram", "8192", "--seed", "42"],
            "tenants": {"spec": spec, "prompts_sha256": "aa" * 32},
            **changes,
        },
    )


def loaded_plan(root, plan, off1, off2, on1, on2, spec=SPEC, load=None, inputs=None):
    load = load or load_record(spec)
    kw = dict(plan=plan, manifest={"tenants": load}, inputs=inputs or loaded_inputs(spec))
    return [
        write_bfcl_run(root, "off", 1, off1, **kw),
        write_bfcl_run(root, "off", 2, off2, **kw),
        write_bfcl_run(root, "on", 1, on1, **kw),
        write_bfcl_run(root, "on", 2, on2, **kw),
    ]
