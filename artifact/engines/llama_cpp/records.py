"""What a llama-server run's records say about the server, held against each other (`./run.sh check`).

A run's manifest records the server three times: the command line it ran (`server_cmd`), the identity it was
paired by (`pairing_inputs.engine`: the same arguments with the port and the model path as placeholders, the
binary's sha256 and the combined sha256 of the binary and its libraries) and the binary's digests (`binary`). The
session's log records it a fourth time (its first line, `$ <command line>`, written by ServerProcess) and every
request's timings (`print_timing`: "prompt eval time = T ms / N tokens", "eval time = T ms / N tokens", with two
decimals). These must agree; `manifest_problem` and `session_log_problems` say where they do not.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import PurePath

from artifact.engines.audit import RecordAudit, Tier
from artifact.engines.llama_cpp.tiers import session_tiers

# server flag -> (Settings field, type): what `server_args` writes for each setting
FLAG_SETTINGS = {
    "-ub": ("ubatch_size", int),
    "-fa": ("flash_attn", str),
    "-ngl": ("gpu_layers", int),
    "-np": ("slots", int),
    "--cache-ram": ("cache_ram_mib", int),
    "-sps": ("slot_prompt_similarity", float),
}
PORT, MODEL = "<port>", re.compile(r"<model sha256 ([0-9a-f]{64})>")
PROMPT_EVAL = re.compile(r"print_timing: id +\d+ \| task \d+ \| prompt eval time = +([\d.]+) ms / +(\d+) tokens")
EVAL = re.compile(r"print_timing: id +\d+ \| task \d+ \| +eval time = +([\d.]+) ms / +(\d+) tokens")


def _table(x) -> dict:
    return x if isinstance(x, dict) else {}


def command_settings(manifest: dict) -> dict:
    """Settings the recorded command line shows (see FLAG_SETTINGS), and pin_slot from the request fields the
    runs were paired by (id_slot 0: pinned; -1: chosen by the server)."""
    cmd = manifest.get("server_cmd")
    out: dict = {}
    if isinstance(cmd, list):
        for flag, value in zip(cmd, cmd[1:]):
            if flag in FLAG_SETTINGS and isinstance(value, str):
                name, kind = FLAG_SETTINGS[flag]
                try:
                    out[name] = kind(value)
                except ValueError:
                    continue
    fields = _table(_table(_table(manifest.get("pairing_inputs")).get("engine")).get("request_fields"))
    if type(fields.get("id_slot")) is int:
        out["pin_slot"] = fields["id_slot"] != -1
    return out


def _model_file_sha256(manifest: dict):
    """The sha256 of the file `-m` loaded, as the manifest records it: model.sha256, or for weights pinned file by
    file (hf:) the first file's (model.files, else config_data.model.files), as the adapter's placeholder names it."""
    model = _table(manifest.get("model"))
    if model.get("sha256"):
        return model["sha256"]
    for files in (model.get("files"), _table(_table(manifest.get("config_data")).get("model")).get("files")):
        if isinstance(files, list) and files and isinstance(files[0], dict) and files[0].get("sha256"):
            return files[0]["sha256"]
    return model.get("sha256")


def _sublist(short: list, long: list) -> bool:
    n = len(short)
    return any(long[i : i + n] == short for i in range(len(long) - n + 1))


def manifest_problem(manifest: dict) -> str | None:
    ident = _table(_table(manifest.get("pairing_inputs")).get("engine"))
    cmd = manifest.get("server_cmd")
    cmd = cmd if isinstance(cmd, list) and all(isinstance(a, str) for a in cmd) else None
    args = ident.get("server_args")
    if cmd is not None and isinstance(args, list):
        got = cmd[1:]
        if len(got) != len(args):
            return (
                f"field 'server_cmd' has {len(got)} arguments, the server_args the runs were paired by "
                f"(pairing_inputs.engine) {len(args)}: the server ran another command line"
            )
        model_sha = _model_file_sha256(manifest)
        for i, (a, want) in enumerate(zip(got, args)):
            m = MODEL.fullmatch(want) if isinstance(want, str) else None
            if want == PORT and a.isdigit():
                continue
            if m is not None:
                if m.group(1) != model_sha:
                    return (
                        f"field 'pairing_inputs.engine.server_args' names model sha256 {m.group(1)[:12]}..., "
                        f"the manifest's model.sha256 is {str(model_sha)[:12]}..."
                    )
                continue
            if a != want:
                return (
                    f"field 'server_cmd' argument {i + 1} is {a!r}, the server_args the runs were paired by "
                    f"(pairing_inputs.engine) have {want!r}: the server ran another command line"
                )
    binary = _table(manifest.get("binary"))
    for field, key in (("sha256", "binary_sha256"), ("files_sha256", "binary_files_sha256")):
        if field in binary and key in ident and binary[field] != ident[key]:
            return (
                f"field 'binary.{field}' is {str(binary[field])[:16]}..., the pairing inputs' "
                f"engine.{key} is {str(ident[key])[:16]}...: the binary recorded is not the one the runs were "
                "paired by"
            )
    files = binary.get("files")
    if isinstance(files, dict) and "files_sha256" in binary:
        combined = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
        if combined != binary["files_sha256"]:
            return (
                f"field 'binary.files_sha256' ({str(binary['files_sha256'])[:16]}...) is not the digest of "
                f"binary.files ({combined[:16]}...)"
            )
    path = binary.get("path")
    if isinstance(path, str):
        if cmd is not None and cmd and cmd[0] != path:
            return f"field 'binary.path' is {path!r}, the server command line (server_cmd) runs {cmd[0]!r}"
        if (
            isinstance(files, dict)
            and "sha256" in binary
            and files.get(PurePath(path).name, binary["sha256"]) != binary["sha256"]
        ):
            return (
                f"field 'binary.sha256' ({str(binary['sha256'])[:16]}...) is not binary.files' digest of "
                f"{PurePath(path).name} ({str(files[PurePath(path).name])[:16]}...)"
            )
    cc = _table(manifest.get("cache_condition"))
    if cmd is not None and isinstance(cc.get("server_args"), list) and not _sublist(cc["server_args"], cmd):
        return (
            f"field 'cache_condition.server_args' ({' '.join(map(str, cc['server_args']))}) is not on the "
            "server command line (server_cmd)"
        )
    build, props = manifest.get("engine_build"), _table(manifest.get("props"))
    if isinstance(build, str) and isinstance(props.get("build_info"), str) and build != props["build_info"]:
        return f"field 'engine_build' is {build!r}, the server's /props build_info is {props['build_info']!r}"
    return None


def log_timings(text: str) -> list[tuple[str, int, str, int]]:
    """Per completion the log shows, in order: (prompt ms as logged, prompt tokens computed, generation ms as
    logged, tokens generated)."""
    prompt, gen = PROMPT_EVAL.findall(text), EVAL.findall(text)  # one pass each, in C
    return [(p, int(pn), g, int(gn)) for (p, pn), (g, gn) in zip(prompt, gen)]


def session_log_problems(manifest: dict, runs: list[list[dict]], text: str) -> list[str | None]:
    """Each run's served requests against the log's timing lines, in send order (failed requests log none): the
    prompt and generation times to the log's two decimals and the token counts must be those the records hold.
    The log may hold more (a run of the session not in these results, after these); the command line on its first
    line must be the manifest's."""
    first = text.split("\n", 1)[0]
    cmd = manifest.get("server_cmd")
    if (
        first.startswith("$ ")
        and isinstance(cmd, list)
        and all(isinstance(a, str) for a in cmd)
        and first[2:] != shlex.join(cmd)
    ):
        why = "its server log was started with another command line than the manifest's server_cmd"
        return [why] * len(runs)
    timings = log_timings(text)
    out: list[str | None] = []
    at = 0
    for reqs in runs:
        why = None
        served = [r for r in reqs if _get(r, "error") is None]
        mine, at = timings[at : at + len(served)], at + len(served)
        if len(mine) < len(served):
            out.append(
                f"its server log holds the timings of {len(timings)} requests, fewer than the session's "
                "records (requests.jsonl)"
            )
            continue
        for r, (pm, pn, gm, gn) in zip(served, mine):
            own = (
                _ms(_get(r, "prompt_ms")),
                _get(r, "prompt_n"),
                _ms(_get(r, "predicted_ms")),
                len(r["output_tokens"]),
            )
            if own != (pm, pn, gm, gn):
                why = (
                    f"episode {r['episode_id']} request {r['request_index']}: requests.jsonl has prompt_ms "
                    f"{_get(r, 'prompt_ms')}, prompt_n {_get(r, 'prompt_n')}, predicted_ms "
                    f"{_get(r, 'predicted_ms')}, "
                    f"{len(r['output_tokens'])} tokens; its server log says {pm} ms / {pn} tokens, {gm} ms / {gn} "
                    "tokens"
                )
                break
        out.append(why)
    return out


def _ms(v) -> str | None:
    return f"{v:.2f}" if type(v) in (int, float) else None


_get = dict.get  # plain lookups: requests may be lazily decoding records


class LlamaAudit(RecordAudit):
    """llama.cpp's record audit: its records against its command line, its binary's digests and its server log."""

    identity_keys = ("engine", "binary_sha256")

    def command_settings(self, manifest: dict) -> dict:
        return command_settings(manifest)

    def manifest_problem(self, manifest: dict) -> str | None:
        """The identity's keys; the command line against the server_args the runs were paired by (port and model
        path aside); the binary's digests against the pairing inputs' and against its files."""
        return super().manifest_problem(manifest) or manifest_problem(manifest)

    def record_problems(self, manifest: dict, requests: list[dict]) -> list[str]:
        """A server the artifact did not start (the default's), and a command line with no server_args the runs
        were paired by: nothing then holds `server_cmd` to the server that served them."""
        problems = super().record_problems(manifest, requests)
        ident = _table(_table(manifest.get("pairing_inputs")).get("engine"))
        if (
            manifest.get("server_cmd")
            and isinstance(manifest.get("pairing_inputs"), dict)
            and "server_args" not in ident
        ):
            problems.append(
                "field 'pairing_inputs.engine' records no server_args (the command line the runs were paired by), "
                "so the manifest's server_cmd is not shown to be the server that served them"
            )
        return problems[:1]

    def session_log_problems(self, manifest: dict, runs: list[list[dict]], log_text: str) -> list[str | None]:
        """The log's command line and per-request timings against the records."""
        return session_log_problems(manifest, runs, log_text)

    def request_tiers(self, manifest: dict, requests: list[dict], log_text: str | None) -> list[Tier]:
        """The slot's KV cache or the host prompt cache, inferred from the server's INFO log (tiers.py)."""
        return session_tiers(manifest, requests, log_text)
