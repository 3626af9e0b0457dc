"""One exception type for every user-facing failure: the CLI prints its message on one line and exits non-zero."""


class ArtifactError(Exception):
    """A failure the user can act on; the message is one line that says what to do."""

    exit_code = 2
