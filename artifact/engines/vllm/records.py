"""vLLM's record audit: a run's manifest held against the `vllm serve` command line its runs were paired by."""

from __future__ import annotations

from artifact.engines.audit import RecordAudit

KIND = "vllm"
ARM_FLAGS = {"on": "--enable-prefix-caching", "off": "--no-enable-prefix-caching"}
SALT = "cache_salt"  # the request field of a salted OFF arm (a unique value per request)


def command_problem(manifest: dict) -> str | None:
    """Why the manifest's command line is not the `vllm serve` its runs were paired by, with its arm's flag."""
    ident = (manifest.get("pairing_inputs") or {}).get("engine") or {}
    args, cmd, arm = ident.get("server_args"), manifest.get("server_cmd"), manifest.get("arm")
    if isinstance(args, list) and (not args or args[0] != "serve"):
        return "field 'pairing_inputs.engine.server_args' does not start with 'serve': not a `vllm serve` command line"
    if not (isinstance(cmd, list) and all(isinstance(a, str) for a in cmd)):
        return None
    if len(cmd) < 2 or cmd[1] != "serve":
        return (
            f"field 'server_cmd' runs {' '.join(cmd[:2])!r}, not `vllm serve`: not a vLLM server's command line "
            f"(engine {KIND!r})"
        )
    # a salted OFF arm (off_arm = "salt": its requests carry a unique cache_salt) runs on a server started as ON's
    salted_off = arm == "off" and SALT in (ident.get("request_fields") or {})
    flag = ARM_FLAGS["on"] if salted_off else ARM_FLAGS.get(arm)
    if flag is not None and (flag not in cmd or any(f in cmd for f in ARM_FLAGS.values() if f != flag)):
        return (
            f"field 'server_cmd' lacks {flag}, the flag of arm {arm!r} (or holds the other arm's): the server ran "
            "another cache condition than the run's arm"
        )
    cc = manifest.get("cache_condition") or {}
    if flag is not None and isinstance(cc, dict) and cc.get("arm_flag") not in (None, flag):
        return f"field 'cache_condition.arm_flag' is {cc.get('arm_flag')!r}, the flag of arm {arm!r} is {flag!r}"
    if isinstance(args, list):
        got = cmd[1:]
        if len(got) != len(args):
            return (
                f"field 'server_cmd' has {len(got)} arguments, the server_args the runs were paired by "
                f"(pairing_inputs.engine) {len(args)}: the server ran another command line"
            )
        for i, (a, want) in enumerate(zip(got, args)):
            if (
                want == "<port>"
                and a.isdigit()
                or want == "<model dir>"
                or isinstance(want, str)
                and want.startswith("<arm: ")
                and a == flag
            ):
                continue
            if a != want:
                return (
                    f"field 'server_cmd' argument {i + 1} is {a!r}, the server_args the runs were paired by "
                    f"(pairing_inputs.engine) have {want!r}: the server ran another command line"
                )
    return None


class VllmAudit(RecordAudit):
    identity_keys = ("engine", "vllm", "server_args")

    def manifest_problem(self, manifest: dict) -> str | None:
        """The identity's keys; the command line is `EXE serve MODEL ...` with the pairing inputs' server_args (port,
        model directory and the arm's flag as placeholders) and the run's own arm flag."""
        return super().manifest_problem(manifest) or command_problem(manifest)
