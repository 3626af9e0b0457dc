"""Exit codes of `./run.sh check` (a module of its own: the command line shows them in `check --help` without
importing the checker)."""

EXIT_CODES = {
    0: "every claim that was tested holds (PASS or OUT-OF-BAND), at least one claim was tested, and every run is valid",
    1: "the hard claim RQ1 FAILs, or a run is invalid (incomplete, marked complete but not whole, without a pairing "
    "fingerprint, a pairing refused, an OFF run served cached tokens, a copy of another run's requests, "
    "renumbered episodes, records that disagree with their server's log)",
    2: "the input is unreadable or malformed (no runs, a corrupt or cut-short record in a complete run, a missing "
    "field, an unknown arm label, a run identity that appears twice, a label that contradicts what the run "
    "recorded, an unsafe server log, an unreadable expected-values file)",
    3: "nothing could be tested: every claim is NOT-RUN or INCONCLUSIVE (and no run is invalid)",
    4: "a claim other than RQ1 FAILs (the runs are valid and RQ1 holds)",
}


def exit_codes_help() -> str:
    return "exit codes:\n" + "\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())
