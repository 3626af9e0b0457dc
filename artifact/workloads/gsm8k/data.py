"""GSM8K bridge data (RQ5): the real test split as the artifact carries it (data/gsm8k/, a byte-for-byte copy of
openai/grade-school-math's test.jsonl, pinned by sha256 and line count), the same split from the Hugging Face Hub, a
local copy in GSM8K's format, and a deterministic synthetic stand-in that only tests use.

Every item carries ``source``: ``"gsm8k"`` for rows read in GSM8K's format, ``"synthetic"``
for generated ones, so manifests and tables can label synthetic results as such.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

from artifact.config import REPO
from artifact.errors import ArtifactError

GSM8K_REPO = "openai/gsm8k"
GSM8K_CONFIG = "main"
GSM8K_SPLIT = "test"
GSM8K_FILENAME = "main/test-00000-of-00001.parquet"
# Commit of the dataset repo and sha256 of GSM8K_FILENAME at that commit (1,319 rows). Not
# looked up on the Hub from here (no network): both values agree across several independent
# public pins of this file. load_gsm8k verifies the sha256, so a wrong pin fails loudly.
GSM8K_REVISION = "740312add88f781978c0658806c59bc2815b9866"
GSM8K_SHA256 = "ee7b8da9e381df27b9e3f7758a159ab2bdaa4dbaa910546cbbc47e0cb44e4f59"

_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")

# The test split the artifact carries: data/gsm8k/test.jsonl with its licence and provenance record beside it.
BUNDLED_DIR = REPO / "data" / "gsm8k"
BUNDLED_FILE = BUNDLED_DIR / "test.jsonl"
BUNDLED_PROVENANCE = BUNDLED_DIR / "PROVENANCE.json"


@dataclass(frozen=True)
class GSM8KItem:
    """One problem: ``answer`` is the reference final number as a string (no commas)."""

    item_id: str
    question: str
    answer: str
    source: str  # "gsm8k" or "synthetic"


# ---------------------------------------------------------------- real GSM8K


def parse_reference(answer_text: str) -> str:
    """The number after GSM8K's final ``####`` marker, commas stripped (``"#### 1,234"`` -> ``"1234"``)."""
    number = answer_text.rsplit("####", 1)[1].strip().replace(",", "") if "####" in answer_text else ""
    if not _NUMBER_RE.fullmatch(number):
        raise ValueError(f"no '#### <number>' line in GSM8K answer: {answer_text[-60:]!r}")
    return number


def _items_from_rows(rows: list[dict], n: int, where: str) -> list[GSM8KItem]:
    """The first ``n`` rows as items with ids ``gsm8k_test_0000``... in file order."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArtifactError(f"GSM8K item count must be a positive integer, got {n!r}")
    if len(rows) < n:
        raise ArtifactError(f"{where} has {len(rows)} GSM8K rows, fewer than the {n} requested")
    items = []
    for index, row in enumerate(rows[:n]):
        try:
            question, reference = str(row["question"]), parse_reference(str(row["answer"]))
        except (KeyError, ValueError) as exc:
            raise ArtifactError(f"{where} row {index} is not in GSM8K format: {exc}") from None
        items.append(GSM8KItem(f"gsm8k_test_{index:04d}", question, reference, "gsm8k"))
    return items


def _read_rows(path: Path, where: str) -> list[dict]:
    """Rows of a parquet file (read by pandas through pyarrow) or a JSON-lines file, in file order."""
    try:
        if path.suffix == ".parquet":
            import pandas as pd

            return pd.read_parquet(path, columns=["question", "answer"]).to_dict("records")
        with path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except ImportError as exc:
        raise ArtifactError(f"reading {where} needs pyarrow (pip install pyarrow): {exc}") from None
    except (OSError, ValueError, KeyError) as exc:
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ArtifactError(f"cannot read GSM8K rows from {where}: {detail}") from None


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_gsm8k_file(path: str | os.PathLike, n: int) -> tuple[list[GSM8KItem], dict]:
    """First ``n`` items of a local GSM8K-format file (``.parquet``, or JSON lines otherwise).

    Each row needs ``question`` and ``answer`` (GSM8K's solution ending in ``#### <number>``).
    Returns (items, provenance) with the file's path, name and sha256.
    """
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"GSM8K file not found: {path}")
    items = _items_from_rows(_read_rows(path, str(path)), n, str(path))
    provenance = {"path": str(path), "filename": path.name, "sha256": sha256_file(path)}
    return items, provenance


def rows_sha256(rows: list[dict]) -> str:
    """The published content hash of the split's rows: each row as Go's encoding/json writes a map (keys sorted, no
    spaces, HTML characters and U+2028/U+2029 escaped), one per line, in file order."""
    digest = hashlib.sha256()
    for row in rows:
        line = json.dumps(row, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        for char, escaped in (
            ("<", "\\u003c"),
            (">", "\\u003e"),
            ("&", "\\u0026"),
            ("\u2028", "\\u2028"),
            ("\u2029", "\\u2029"),
        ):
            line = line.replace(char, escaped)
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


def load_gsm8k_bundled(n: int, directory: Path | None = None) -> tuple[list[GSM8KItem], dict]:
    """First ``n`` items of the test split the artifact carries (data/gsm8k/), in file order.

    Before anything is read as items, the whole file is checked against its provenance record: sha256, size and line
    count; the rows' content hash is computed and must be the Hub split's published one. Returns (items, provenance)
    with the repository, commit, path, sha256, line count and the rows' hash (what a Hub run can be compared with).
    """
    folder = directory or BUNDLED_DIR
    where = folder / "test.jsonl"
    try:
        record = json.loads((folder / "PROVENANCE.json").read_text(encoding="utf-8"))
        want_sha, want_lines, want_rows = record["sha256"], record["lines"], record["hub_split"]["rows_sha256"]
        source = record["source"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"{folder / 'PROVENANCE.json'}: cannot read the GSM8K provenance record ({exc})") from None
    if not where.is_file():
        raise ArtifactError(f"{where}: the GSM8K test split the artifact carries is missing (git checkout {where})")
    digest = sha256_file(where)
    if digest != want_sha:
        raise ArtifactError(
            f"{where}: sha256 {digest[:16]}..., not the pinned {want_sha[:16]}... (restore it: git checkout {where})"
        )
    rows = _read_rows(where, str(where))
    if len(rows) != want_lines:
        raise ArtifactError(f"{where}: {len(rows)} rows, the provenance record says {want_lines}")
    content = rows_sha256(rows)
    if content != want_rows:
        raise ArtifactError(f"{where}: rows hash {content[:16]}..., not the Hub split's {want_rows[:16]}...")
    items = _items_from_rows(rows, n, str(where))
    provenance = {
        "repository": source["repository"],
        "commit": source["commit"],
        "path": source["path"],
        "filename": where.name,
        "sha256": digest,
        "lines": len(rows),
        "rows_sha256": content,
        "equals": f"{record['hub_split']['dataset']} {record['hub_split']['config']}/{record['hub_split']['split']} "
        "(the rows hash is the Hub split's published one)",
    }
    return items, provenance


def fetch_hint(revision: str = GSM8K_REVISION) -> str:
    """The command that puts the pinned GSM8K test file into the Hugging Face cache."""
    return f"hf download {GSM8K_REPO} {GSM8K_FILENAME} --repo-type dataset --revision {revision}"


def _offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it only once, at import)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def load_gsm8k(
    n: int,
    revision: str = GSM8K_REVISION,
    cache_dir: str | os.PathLike | None = None,
    expected_sha256: str | None = GSM8K_SHA256,
) -> tuple[list[GSM8KItem], dict]:
    """First ``n`` items of the GSM8K test split (config ``main``) from the Hub, in file order.

    The file is fetched with ``hf_hub_download`` into the Hugging Face cache (or ``cache_dir``)
    and reused from there offline. ``expected_sha256`` is checked only at the pinned revision;
    pass None to skip the check. Raises ArtifactError, with a one-line message saying how to
    fetch the file, when it is neither cached nor reachable.
    Returns (items, provenance) with repo, config, split, revision, filename and sha256.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        local = hf_hub_download(
            repo_id=GSM8K_REPO,
            repo_type="dataset",
            filename=GSM8K_FILENAME,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=_offline(),
        )
    except LocalEntryNotFoundError:
        raise ArtifactError(
            f"GSM8K test file {GSM8K_REPO}@{revision} is not in the Hugging Face cache and the Hub "
            f"cannot be reached; on a networked machine with HF_HUB_OFFLINE unset run: "
            f"{fetch_hint(revision)}" + (f" --cache-dir {cache_dir}" if cache_dir else "")
        ) from None
    except (EntryNotFoundError, HfHubHTTPError, OSError) as exc:
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ArtifactError(f"cannot fetch GSM8K {GSM8K_REPO}@{revision}/{GSM8K_FILENAME}: {first_line}") from None

    digest = sha256_file(local)
    if revision == GSM8K_REVISION and expected_sha256 and digest != expected_sha256:
        raise ArtifactError(
            f"GSM8K file {local} has sha256 {digest}, expected {expected_sha256} at revision {revision}"
        )
    where = f"{GSM8K_REPO}@{revision}"
    rows = _read_rows(Path(local), where)
    items = _items_from_rows(rows, n, where)
    provenance = {
        "repo": GSM8K_REPO,
        "config": GSM8K_CONFIG,
        "split": GSM8K_SPLIT,
        "revision": revision,
        "filename": GSM8K_FILENAME,
        "sha256": digest,
        "lines": len(rows),
        "rows_sha256": rows_sha256([{"question": str(r["question"]), "answer": str(r["answer"])} for r in rows]),
    }
    return items, provenance


# ---------------------------------------------------------------- synthetic stand-in

_NAMES = ("Maya", "Omar", "Lena", "Tariq", "Sofia", "Ben", "Aiko", "Diego", "Priya", "Jonas")
_GOODS = (("notebook", "notebooks"), ("pen", "pens"), ("apple", "apples"), ("ticket", "tickets"))
_TREATS = ("cookies", "stickers", "marbles", "crayons", "cards")
_SALE_GOODS = (("jacket", "jackets"), ("backpack", "backpacks"), ("lamp", "lamps"), ("helmet", "helmets"))


def _shopping(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(_NAMES)
    (_, a2), (_, b2) = rng.choice(_GOODS[:2]), rng.choice(_GOODS[2:])
    qa, pa, qb, pb = rng.randint(2, 9), rng.randint(2, 15), rng.randint(2, 12), rng.randint(1, 6)
    question = (
        f"{name} buys {qa} {a2} for ${pa} each and {qb} {b2} for ${pb} each. "
        f"How many dollars does {name} spend in total?"
    )
    return question, qa * pa + qb * pb


def _sharing(rng: random.Random) -> tuple[str, int]:
    name, treat = rng.choice(_NAMES), rng.choice(_TREATS)
    friends, each, boxes = rng.randint(3, 9), rng.randint(4, 15), rng.choice((2, 3, 4))
    total = friends * each * boxes
    question = (
        f"{name} has {boxes} boxes with {total // boxes} {treat} in each box. {name} shares all "
        f"the {treat} equally among {friends} friends. How many {treat} does each friend get?"
    )
    return question, each * boxes


def _rate(rng: random.Random) -> tuple[str, int]:
    speed1, hours1 = rng.randint(35, 70), rng.randint(2, 6)
    speed2, minutes2 = 2 * rng.randint(10, 30), rng.choice((30, 60, 90, 120))  # even: whole miles
    question = (
        f"A truck drives at {speed1} miles per hour for {hours1} hours, then at {speed2} miles "
        f"per hour for {minutes2} minutes. How many miles does it drive in total?"
    )
    return question, speed1 * hours1 + speed2 * minutes2 // 60


def _multi_step(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(_NAMES)
    jars, per_jar = rng.randint(3, 8), rng.randint(12, 40)
    bags, per_bag = rng.randint(2, 6), rng.randint(5, 20)
    given = rng.randint(5, 30)
    start = jars * per_jar - bags * per_bag + given
    while start < given + 10:  # keep the story plausible: enough marbles to give some away
        per_jar += 10
        start = jars * per_jar - bags * per_bag + given
    question = (
        f"{name} had {start} marbles. {name} gave {given} marbles to a friend and then bought "
        f"{bags} bags with {per_bag} marbles each. {name} then put all the marbles into {jars} "
        f"jars with the same number in each jar. How many marbles are in each jar?"
    )
    return question, per_jar


def _large(rng: random.Random) -> tuple[str, int]:
    rows, trees, apples = rng.randint(12, 60), rng.randint(15, 45), rng.randint(8, 30)
    question = (
        f"An orchard has {rows} rows with {trees} apple trees in each row. Each tree gives "
        f"{apples} apples. How many apples does the orchard produce?"
    )
    return question, rows * trees * apples


def _wages(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(_NAMES)
    wage, hours, days = rng.randint(12, 35), rng.randint(4, 9), rng.randint(10, 24)
    rent = rng.randint(2, 9) * 50
    question = (
        f"{name} earns ${wage} per hour and works {hours} hours a day for {days} days. "
        f"{name} then pays ${rent} for rent. How much money, in dollars, does {name} have left?"
    )
    return question, wage * hours * days - rent


def _discount(rng: random.Random) -> tuple[str, int]:
    thing, things = rng.choice(_SALE_GOODS)
    price, percent, count = rng.randint(2, 15) * 20, rng.choice((10, 20, 25, 50)), rng.randint(2, 6)
    question = (
        f"A {thing} costs ${price}. During a sale every {thing} is {percent}% off. "
        f"How many dollars do {count} {things} cost during the sale?"
    )
    return question, count * price * (100 - percent) // 100


_TEMPLATES = (_shopping, _sharing, _rate, _multi_step, _large, _wages, _discount)


def synthetic_items(n: int, seed: int = 42) -> list[GSM8KItem]:
    """``n`` deterministic grade-school word problems with integer answers, ids ``synthetic_0000``...

    Item ``i`` uses template ``i % 7`` and a ``random.Random`` seeded from the string
    ``"gsm8k-synthetic:{seed}:{i}:{attempt}"`` (string seeds hash with SHA-512, stable across
    Python versions and platforms); ``attempt`` counts up from 0 past questions already drawn,
    so questions are distinct and the first ``k`` items never depend on ``n``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ArtifactError(f"synthetic item count must be a non-negative integer, got {n!r}")
    items, seen = [], set()
    for index in range(n):
        template = _TEMPLATES[index % len(_TEMPLATES)]
        attempt = 0
        while True:
            question, answer = template(random.Random(f"gsm8k-synthetic:{seed}:{index}:{attempt}"))
            if question not in seen:
                break
            attempt += 1
        seen.add(question)
        items.append(GSM8KItem(f"synthetic_{index:04d}", question, str(answer), "synthetic"))
    return items
