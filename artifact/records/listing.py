"""What a reader of a results directory may read: every entry under it, listed by one walk (`entries`).

The run finder (`store.find_runs`: the runs, by their manifests) and the checker's replay key
(`artifact.check.replay`: the names, kinds and sizes of these entries, and every file's sha256) both take this
listing, so that what finds the runs and what decides that a check may be replayed are one definition: every entry
under the results directory but the check's own output folder (`skip`, where it lies under the results). Nothing
check reads of the results lies outside it (a run's record files, the server log its manifest names under the plan
directory: `check.run` keeps a check for a replay only where every file it read is listed).

The walk follows no symbolic link (a link is listed as one), lists folders to at most MAX_DEPTH below the results
directory and reads nothing but the folders' entries and their metadata; a folder that cannot be read, a results
path that is not a folder (or cannot be reached: a loop of links), or folders nested deeper is one line
(ArtifactError), decided before any record is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from artifact.errors import ArtifactError

# How deep folders may nest below a results directory: runs lie at <config>/<plan>/<run>/ (their logs one deeper);
# a results directory kept inside folders of one's own adds a few levels, never dozens.
MAX_DEPTH = 32


class Entry(NamedTuple):
    rel: str  # the path relative to the results directory
    kind: str  # "f" a regular file, "d" a folder, "l" a symbolic link, "o" anything else (a pipe, socket, device)
    size: int  # a file's size, a link target's length, else 0
    mtime_ns: int  # a folder's 0 (what it holds is listed itself)
    ctime_ns: int


Listing = list[Entry]


def root_problem(root: Path) -> str | None:
    """Why `root` cannot be read as a results directory (it does not exist, is no folder, or cannot be reached),
    or None."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return f"results directory {root} does not exist"
    except (OSError, ValueError) as exc:  # a loop of links, a name too long, a NUL byte
        return f"cannot read the results path {root} ({getattr(exc, 'strerror', None) or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return f"results path {root} is not a directory (give the folder that holds the runs)"
    return None


def resolved(path: Path) -> str:
    """`path` with every link resolved as far as it can be (never raises: a loop is left as it is)."""
    return os.path.realpath(path)


def entries(root: Path, skip: Path | None = None) -> Listing:
    """Every entry under `root` (sorted by relative path, a folder before what it holds), `skip` and what it holds
    left out; ArtifactError (one line) where `root` is no readable folder, an entry cannot be read, or folders nest
    deeper than MAX_DEPTH."""
    problem = root_problem(root)
    if problem:
        raise ArtifactError(problem)
    base = resolved(root)
    left_out = resolved(skip) if skip is not None else None
    out: Listing = []
    stack: list[tuple[str, str, int]] = [(base, "", 0)]
    while stack:
        here, rel_here, depth = stack.pop()
        try:
            with os.scandir(here) as it:
                found = sorted(it, key=lambda e: e.name)
            for e in found:
                if e.path == left_out:
                    continue
                rel = os.path.join(rel_here, e.name) if rel_here else e.name
                st = e.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    out.append(Entry(rel, "l", len(os.readlink(e.path)), st.st_mtime_ns, st.st_ctime_ns))
                elif stat.S_ISDIR(st.st_mode):
                    if depth + 1 > MAX_DEPTH:
                        raise ArtifactError(
                            f"{os.path.join(str(root), rel)}: folders nest more than {MAX_DEPTH} deep under the results directory {root}; "
                            "runs lie a few folders deep: check the folder that holds them"
                        )
                    out.append(Entry(rel, "d", 0, 0, 0))
                    stack.append((e.path, rel, depth + 1))
                elif stat.S_ISREG(st.st_mode):
                    out.append(Entry(rel, "f", st.st_size, st.st_mtime_ns, st.st_ctime_ns))
                else:
                    out.append(Entry(rel, "o", 0, st.st_mtime_ns, st.st_ctime_ns))
        except OSError as exc:
            where = os.path.join(str(root), rel_here) if rel_here else str(root)
            raise ArtifactError(f"cannot read {where} under the results directory ({exc.strerror or exc})") from None
    out.sort(key=lambda e: e.rel.split(os.sep))
    return out
