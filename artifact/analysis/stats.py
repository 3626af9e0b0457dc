"""Statistics used to compare the paper's rates with observed ones.

Every function takes plain counts or a 0/1 sequence and returns floats; scipy and
numpy do the numerical work. Conventions: rates are fractions in [0, 1],
confidence levels are two-sided, p-values are two-sided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "seeded_integers",
    "wilson_interval",
    "normal_sf",
    "block_bootstrap_interval",
    "cochran_armitage",
    "mcnemar_exact",
    "mcnemar_power",
    "mantel_haenszel",
]


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval (no continuity correction) for the rate k/n.

    k = 0 gives low = 0 and k = n gives high = 1. Raises ValueError for n = 0
    (a rate over no observations has no interval; callers report "not run").
    """
    from scipy.special import ndtri  # scipy: a slow import, not needed to draw the figures

    k, n = int(k), int(n)
    if n <= 0:
        raise ValueError(f"wilson_interval needs n >= 1, got n={n}")
    if not 0 <= k <= n:
        raise ValueError(f"wilson_interval needs 0 <= k <= n, got k={k}, n={n}")
    if not 0 <= confidence <= 1:
        raise ValueError(f"wilson_interval needs a confidence level in [0, 1], got {confidence}")
    # scipy.stats.binomtest(k, n).proportion_ci(confidence, method="wilson"), operation for operation (scipy 1.x's
    # _binom_wilson_conf_int, two-sided, no correction: the same floats), without binomtest's p-value (an exact
    # binomial sum per call, ~2.5 ms; check computes ~170 intervals) nor scipy.stats' import
    p = k / n
    z = ndtri(0.5 + 0.5 * confidence)
    denom = 2 * (n + z**2)
    center = (2 * n * p + z**2) / denom
    delta = z / denom * math.sqrt(4 * n * p * (1 - p) + z**2)
    low = 0.0 if k == 0 else center - delta
    high = 1.0 if k == n else center + delta
    return float(low), float(high)


def normal_sf(z: float):
    """The standard normal's upper tail P(Z > z): scipy.stats.norm.sf(z) as scipy computes it (`_norm_sf`:
    scipy.special.ndtr(-z), the same float; tests/analysis/test_stats.py holds the two equal), without scipy.stats'
    import (~0.3 s; check's paper tables need only this tail, and ask for it before the figures can be drawn)."""
    from scipy.special import ndtr  # scipy: a slow import, not needed to draw the figures

    return ndtr(-z)


def block_bootstrap_interval(
    flags: Sequence[int] | np.ndarray,
    block_length: int = 5,
    n_boot: int = 10_000,
    confidence: float = 0.95,
    seed: int = 42,
) -> tuple[float, float]:
    """Circular block bootstrap percentile interval for the mean of a 0/1 sequence.

    ``flags`` are per-episode outcomes (1 = diverged) in the order the episodes
    ran; neighbouring episodes share cache state, so they are resampled in
    blocks of ``block_length`` consecutive episodes. The blocks wrap around the
    end of the sequence (the circular block bootstrap, Politis & Romano 1992):
    starts are drawn uniformly from 0..n-1, so every episode is equally likely to
    be drawn. The non-circular moving-block bootstrap (Kuensch 1989) draws
    starts from 0..n-L only, which under-samples the first and last L-1
    episodes: when the only divergence is the last episode, its upper bound can
    equal the estimate. Each replicate concatenates ceil(n / L) blocks and keeps
    the first n values.

    Default L = 5: block length of order n^(1/3) is the usual rule (Hall,
    Horowitz & Jing 1995, Biometrika 82:561); the paper's n = 80 episodes give
    80^(1/3) ~ 4.3, rounded up to 5. L = 1 is the ordinary iid bootstrap.
    L is capped at max(1, n // 2) so every replicate draws at least two blocks.

    Vectorised: block sums come from a prefix sum over the sequence followed by
    its first L values, replicates are rows of a (n_boot, blocks) array. Seeded
    with numpy.random.default_rng(seed). The flags are 0/1, so every block sum
    and replicate total is a small integer, exact in floating point whatever the
    order of the additions: each block's sum is looked up in a table of the n
    possible starts, and the starts drawn for (seed, n, n_boot, blocks) are kept
    (`_block_starts`: check computes many intervals over one episode count).
    """
    x = np.asarray(flags, dtype=float).ravel()
    n = x.size
    if n == 0:
        raise ValueError("block_bootstrap_interval needs at least one flag")
    if not np.all((x == 0) | (x == 1)):
        raise ValueError("block_bootstrap_interval expects a 0/1 sequence")
    if block_length < 1 or n_boot < 1 or not 0 < confidence < 1:
        raise ValueError("need block_length >= 1, n_boot >= 1, 0 < confidence < 1")
    L = min(int(block_length), max(1, n // 2))
    n_blocks = math.ceil(n / L)
    tail = n - (n_blocks - 1) * L  # length kept from the last block, 1..L

    csum = np.concatenate(([0.0], np.cumsum(np.concatenate((x, x[:L])))))  # wrapped: a block may run past n
    full_starts, last_starts = _block_starts(seed, n, n_boot, n_blocks)
    full = (csum[L : L + n] - csum[:n])[full_starts].sum(axis=1)  # the sum of the block starting at s, by s
    last = (csum[tail : tail + n] - csum[:n])[last_starts]
    means = (full + last) / n

    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


_DRAWS: dict[tuple, np.ndarray | tuple[np.ndarray, np.ndarray]] = {}


def _block_starts(seed: int, n: int, n_boot: int, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """The block starts of every replicate, numpy.random.default_rng(seed).integers(0, n, (n_boot, n_blocks)),
    split into those of the full blocks (C-contiguous, (n_boot, n_blocks - 1)) and those of the last block; kept
    as `seeded_integers` keeps its draws."""
    key = ("blocks", seed, n, (n_boot, n_blocks))
    hit = _DRAWS.get(key)
    if hit is None:
        starts = np.random.default_rng(seed).integers(0, n, size=(n_boot, n_blocks))
        hit = (np.ascontiguousarray(starts[:, :-1]), starts[:, -1].copy())
        _keep(key, hit)
    return hit


def seeded_integers(seed: int, high: int, shape: tuple[int, ...]) -> np.ndarray:
    """numpy.random.default_rng(seed).integers(0, high, shape) (int64), read-only, kept for the last few (seed,
    high, shape) of at most 32 MiB: a check draws the same resamples for every comparison over as many episodes."""
    key = (seed, high, shape)
    hit = _DRAWS.get(key)
    if hit is None:
        hit = np.random.default_rng(seed).integers(0, high, size=shape, dtype=np.int64)
        _keep(key, hit)
    return hit


def _keep(key: tuple, arrays) -> None:
    """Keep read-only draws for the next call with `key` (at most 4 keys, 32 MiB a key)."""
    arrays = arrays if isinstance(arrays, tuple) else (arrays,)
    for a in arrays:
        a.setflags(write=False)
    if sum(a.nbytes for a in arrays) <= 32 << 20:
        if len(_DRAWS) >= 4:
            _DRAWS.pop(next(iter(_DRAWS)))
        _DRAWS[key] = arrays if len(arrays) > 1 else arrays[0]


def cochran_armitage(k: Sequence[int], n: Sequence[int], scores: Sequence[float] | None = None) -> tuple[float, float]:
    """Cochran-Armitage test for a linear trend in k_i / n_i over ordered groups.

    z = sum s_i (k_i - n_i p) / sqrt(p (1 - p) [sum n_i s_i^2 - (sum n_i s_i)^2 / N]),
    p = sum k / N (Agresti 2002, Categorical Data Analysis, 2nd ed., ch. 5);
    z^2 = N r^2 with r the score/outcome correlation over the N items.
    z > 0 when the proportion rises with the score; p is two-sided normal.
    Default scores are 0..m-1. If no group has an event (or every item has one)
    there is nothing to order: returns (0.0, 1.0).
    """
    k_arr = np.asarray(k, dtype=float)
    n_arr = np.asarray(n, dtype=float)
    s = np.arange(k_arr.size, dtype=float) if scores is None else np.asarray(scores, dtype=float)
    if not (k_arr.ndim == n_arr.ndim == s.ndim == 1 and k_arr.size == n_arr.size == s.size):
        raise ValueError("cochran_armitage needs k, n and scores of equal length")
    if k_arr.size < 2:
        raise ValueError("cochran_armitage needs at least two groups")
    if np.any(n_arr <= 0) or np.any(k_arr < 0) or np.any(k_arr > n_arr):
        raise ValueError("cochran_armitage needs n_i >= 1 and 0 <= k_i <= n_i")
    total = n_arr.sum()
    p = k_arr.sum() / total
    if p in (0.0, 1.0):
        return 0.0, 1.0
    spread = (n_arr * s**2).sum() - (n_arr * s).sum() ** 2 / total
    if spread <= 0:
        raise ValueError("cochran_armitage needs scores that differ between groups")
    z = (s * (k_arr - n_arr * p)).sum() / math.sqrt(p * (1 - p) * spread)
    return float(z), float(2 * normal_sf(abs(z)))


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for discordant counts b and c.

    Under H0 b ~ Binomial(b + c, 1/2); p = 2 * P(X <= min(b, c)), capped at 1
    (scipy.stats.binomtest). b + c = 0 gives 1.0.
    """
    from scipy import stats  # scipy: a slow import, not needed to draw the figures

    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_exact needs non-negative counts, got b={b}, c={c}")
    if b + c == 0:
        return 1.0
    return float(stats.binomtest(b, b + c, 0.5).pvalue)


def mcnemar_power(n: int, discordant_rate: float, net_shift: float, alpha: float = 0.05) -> float:
    """Exact power of the two-sided exact McNemar test at level ``alpha``.

    n paired items; each is discordant with probability ``discordant_rate``
    (so D ~ Binomial(n, discordant_rate)), and a discordant pair favours the
    first arm with p_b = (discordant_rate + net_shift) / (2 discordant_rate), so
    E[b - c] / n = net_shift. Power = sum_d P(D = d) P(reject | d), where the
    rejection region for d is b <= t_d or b >= d - t_d, t_d the largest b with
    2 * P(Bin(d, 1/2) <= b) <= alpha. Values of d with P(D = d) < 1e-16 are
    skipped (their total mass is below float resolution).
    """
    from scipy import stats  # scipy: a slow import, not needed to draw the figures

    n = int(n)
    r, shift = float(discordant_rate), float(net_shift)
    if n < 1 or not 0 < r <= 1 or abs(shift) > r or not 0 < alpha < 1:
        raise ValueError("mcnemar_power needs n >= 1, 0 < discordant_rate <= 1, |net_shift| <= discordant_rate")
    p_b = (r + shift) / (2 * r)

    d_lo = int(stats.binom.ppf(1e-16, n, r))
    d_hi = int(stats.binom.isf(1e-16, n, r))
    d = np.arange(d_lo, d_hi + 1)
    # t_d: the largest b whose null two-sided p for the lower tail, 2 P(Bin(d, 1/2) <= b), is <= alpha (-1: none).
    # The quantile puts it within one of the answer; the two corrections make it exact (and -1 where none).
    t = stats.binom.ppf(alpha / 2, d, 0.5).astype(int)
    t = np.where(2 * stats.binom.cdf(t, d, 0.5) <= alpha, t, t - 1)
    t = np.where((t + 1 <= d) & (2 * stats.binom.cdf(t + 1, d, 0.5) <= alpha), t + 1, t)
    t = np.maximum(t, -1)  # region is b = 0..t_d

    reject_low = np.where(t >= 0, stats.binom.cdf(t, d, p_b), 0.0)
    reject_high = np.where(t >= 0, stats.binom.sf(d - t - 1, d, p_b), 0.0)
    power = (stats.binom.pmf(d, n, r) * (reject_low + reject_high)).sum()
    return float(power)


def mcnemar_items_for_power(
    discordant_rate: float, net_shift: float, power: float = 0.80, alpha: float = 0.05, n_max: int = 1_000_000
) -> int | None:
    """The smallest number of paired items at which ``mcnemar_power`` reaches ``power`` (found by doubling, then
    bisection; the exact test's power is not strictly monotone in n, so this is the first crossing the search
    finds, to within a few items), or None when even ``n_max`` items fall short."""
    r, shift = float(discordant_rate), float(net_shift)
    if not 0 < r <= 1 or abs(shift) > r or shift == 0 or not 0 < power < 1:
        raise ValueError(
            "mcnemar_items_for_power needs 0 < discordant_rate <= 1 and 0 < |net_shift| <= discordant_rate"
        )
    lo, hi = 0, 1
    while mcnemar_power(hi, r, shift, alpha) < power:
        if hi >= n_max:
            return None
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mcnemar_power(mid, r, shift, alpha) >= power else (mid, hi)
    return hi


def mantel_haenszel(tables: Sequence[Sequence[int]], alternative: str = "greater") -> tuple[float, float]:
    """Cochran-Mantel-Haenszel test of one 2x2 association across strata.

    Each table is (a, b, c, d) = (exposed with event, exposed without, unexposed with event, unexposed without),
    one per stratum (e.g. per configuration). Returns (the Mantel-Haenszel common odds ratio, p) for the
    continuity-corrected statistic (sum a - sum E[a] -/+ 1/2) / sqrt(sum Var[a]) on the normal scale: one-sided
    "greater" (events more likely when exposed), "less", or "two-sided". Strata with fewer than two units or no
    variance carry no information and are skipped; none left gives (nan, 1.0).
    """
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative must be greater, less or two-sided, got {alternative!r}")
    sum_a = sum_e = sum_v = num = den = 0.0
    for t in tables:
        a, b, c, d = (int(x) for x in t)
        if min(a, b, c, d) < 0:
            raise ValueError(f"mantel_haenszel needs non-negative counts, got {t}")
        n = a + b + c + d
        r1, r2, c1, c2 = a + b, c + d, a + c, b + d
        if n < 2 or not (r1 and r2 and c1 and c2):
            continue
        sum_a += a
        sum_e += r1 * c1 / n
        sum_v += r1 * r2 * c1 * c2 / (n * n * (n - 1))
        num += a * d / n
        den += b * c / n
    if sum_v == 0:
        return float("nan"), 1.0
    diff = sum_a - sum_e
    if alternative == "two-sided":
        z = max(0.0, abs(diff) - 0.5) / math.sqrt(sum_v)
        p = 2 * normal_sf(z)
    else:
        sign = 1 if alternative == "greater" else -1
        z = (sign * diff - 0.5) / math.sqrt(sum_v)
        p = normal_sf(z)
    odds = num / den if den else float("inf")
    return float(odds), float(min(1.0, p))
