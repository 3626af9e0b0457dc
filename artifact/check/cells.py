"""Text cells of check's CSVs that a spreadsheet would run as a formula: a model name, a tenant's label or
any other text from the records that starts with '=', '+', '-' or '@' (or a tab or carriage return, which some
spreadsheets skip before those) is written with a leading apostrophe, as spreadsheet-safety guides advise (OWASP's
"CSV injection"). Only text is changed: numbers stay numbers (a float -0.5 is written as before), and so does text
that is a number as written ("-0.5", "+3", "-inf") or only dashes (the "-" placeholder of a scope that has none),
which no spreadsheet evaluates as a formula."""

from __future__ import annotations

from typing import TypeGuard

import pandas as pd

_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def dangerous(value: object) -> TypeGuard[str]:
    """Whether a cell's value is text a spreadsheet would read as a formula."""
    return isinstance(value, str) and value.startswith(_STARTS) and not _number(value) and value.strip("-") != ""


def neutralised(value: object) -> object:
    return "'" + value if dangerous(value) else value


def safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """`df`, or a copy of it whose text cells are neutralised (`neutralised`) where any needs it (numbers, and
    columns that hold no text, are left as they are)."""
    out = None
    for i, dtype in enumerate(df.dtypes):
        if not pd.api.types.is_object_dtype(dtype) and not isinstance(dtype, pd.StringDtype):
            continue
        col = df.iloc[:, i]
        if not any(map(dangerous, col.tolist())):
            continue
        if out is None:
            out = df.copy()
        out.isetitem(i, col.map(neutralised))
    return df if out is None else out
