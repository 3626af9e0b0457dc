"""Display helpers shared by the report and by the workloads' report sections: numbers, percentages, rates with
their intervals, DataFrame rows with missing values as None."""

from __future__ import annotations

import math

import pandas as pd


def missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def pct(x, digits: int = 1) -> str:
    return "-" if missing(x) else f"{100 * float(x):.{digits}f}%"


def num(x, digits: int = 2) -> str:
    if missing(x):
        return "-"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def rate_cell(row, prefix: str) -> dict:
    """{'main': 'k/n (r%)', 'sub': 'Wilson a-b, bootstrap c-d'} for the rate columns `<prefix>_*` of a row."""
    n = row.get(f"{prefix}_n")
    if missing(n) or not n:
        return {"main": "not run", "sub": ""}
    k = int(row[f"{prefix}_k"])
    sub = f"W {pct(row[f'{prefix}_wilson_lo'])}-{pct(row[f'{prefix}_wilson_hi'])}"
    if not missing(row.get(f"{prefix}_boot_lo")):
        sub += f", B {pct(row[f'{prefix}_boot_lo'])}-{pct(row[f'{prefix}_boot_hi'])}"
    return {"main": f"{k}/{int(n)} ({pct(row[f'{prefix}_rate'])})", "sub": sub}


def records(df: pd.DataFrame | None) -> list[dict]:
    if df is None or df.empty:
        return []
    return [{k: (None if missing(v) else v) for k, v in r.items()} for r in df.to_dict("records")]
