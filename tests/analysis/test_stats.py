"""Statistics against independently derived values.

Each reference comes from somewhere other than the implementation: a closed form
worked out here, a published worked example, exact enumeration with math.comb,
or a property the procedure must have. Nothing here re-runs the formula the
module uses.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from artifact.analysis.stats import (
    block_bootstrap_interval,
    cochran_armitage,
    mcnemar_exact,
    mantel_haenszel,
    mcnemar_items_for_power,
    mcnemar_power,
    normal_sf,
    wilson_interval,
)

Z975 = 1.959963984540054  # standard normal 0.975 quantile


# --- Wilson ---------------------------------------------------------------


def test_wilson_zero_successes_closed_form():
    # k = 0: the score interval is [0, z^2 / (n + z^2)].
    # n = 80:  3.841459 / (80 + 3.841459)  = 3.841459 / 83.841459  = 0.045818
    low, high = wilson_interval(0, 80)
    assert low == 0.0
    assert high == pytest.approx(0.045818, abs=1e-6)
    # Paper, sec. IV-A: "0/800 ... pinning the ceiling ... at 0.5% (95% CI)".
    # n = 800: 3.841459 / 803.841459 = 0.0047789 -> rounds to 0.5 %.
    low, high = wilson_interval(0, 800)
    assert low == 0.0
    assert high == pytest.approx(0.0047789, abs=1e-7)
    assert round(100 * high, 1) == 0.5


def test_wilson_all_successes_mirrors_zero():
    # k = n: by symmetry [n / (n + z^2), 1]; 80 / 83.841459 = 0.954182.
    low, high = wilson_interval(80, 80)
    assert high == 1.0
    assert low == pytest.approx(0.954182, abs=1e-6)


def test_wilson_half_closed_form():
    # k/n = 1/2, n = 10: centre 1/2, half-width z sqrt(n/4 + z^2/4) / (n + z^2)
    # = 1.959964 * sqrt(2.5 + 0.960365) / 13.841459 = 1.959964 * 1.8602056 / 13.841459
    # = 3.645936 / 13.841459 = 0.263407  ->  (0.236593, 0.763407)
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.236593, abs=1e-6)
    assert high == pytest.approx(0.763407, abs=1e-6)


@pytest.mark.parametrize(
    "k, n, low, high",
    [  # Newcombe (1998), Stat. Med. 17:857-872, Table I, method 3 (score, no CC)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0000, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_newcombe_table(k, n, low, high):
    got = wilson_interval(k, n)
    assert got[0] == pytest.approx(low, abs=5e-5)
    assert got[1] == pytest.approx(high, abs=5e-5)


def test_wilson_rejects_empty_and_bad_counts():
    with pytest.raises(ValueError):
        wilson_interval(0, 0)
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


# --- circular block bootstrap --------------------------------------------


def _markov_flags(n, stay, seed):
    """0/1 chain that keeps its state with probability ``stay`` (positive autocorrelation)."""
    rng = np.random.default_rng(seed)
    x = np.empty(n, dtype=int)
    x[0] = 1
    for i in range(1, n):
        x[i] = x[i - 1] if rng.random() < stay else 1 - x[i - 1]
    return x


def test_bootstrap_constant_sequences():
    assert block_bootstrap_interval([0] * 80) == (0.0, 0.0)
    assert block_bootstrap_interval([1] * 80) == (1.0, 1.0)


def test_bootstrap_deterministic_given_seed():
    x = _markov_flags(80, 0.8, seed=1)
    assert block_bootstrap_interval(x, seed=7) == block_bootstrap_interval(x, seed=7)


def test_bootstrap_iid_matches_binomial_quantiles():
    # With L = 1 the bootstrap distribution of the mean is exactly Bin(n, p_hat) / n,
    # so the percentile endpoints must sit at the binomial quantiles (within one grid step).
    x = np.array([1] * 29 + [0] * 51)  # 29/80 = 36.25 %
    low, high = block_bootstrap_interval(x, block_length=1, n_boot=20_000)
    ref_low = stats.binom.ppf(0.025, 80, 29 / 80) / 80
    ref_high = stats.binom.ppf(0.975, 80, 29 / 80) / 80
    assert abs(low - ref_low) <= 1 / 80 + 1e-12
    assert abs(high - ref_high) <= 1 / 80 + 1e-12


def test_bootstrap_width_matches_exact_block_variance():
    # n a multiple of L: a replicate is the mean of n/L blocks drawn uniformly from the
    # n circular blocks (wrapping past the end), so its variance is var(block means) / (n/L).
    # The percentile interval should be close to mean +- 1.96 sd of that distribution.
    x = _markov_flags(400, 0.9, seed=3)
    L = 10
    wrapped = np.concatenate((x, x[:L]))
    block_means = np.array([wrapped[s : s + L].mean() for s in range(len(x))])
    sd = math.sqrt(block_means.var() / (len(x) / L))
    low, high = block_bootstrap_interval(x, block_length=L, n_boot=20_000)
    assert high - low == pytest.approx(2 * Z975 * sd, rel=0.08)
    assert (low + high) / 2 == pytest.approx(block_means.mean(), abs=0.01)


def test_bootstrap_samples_the_ends_of_the_sequence_circularly():
    # Only the last of 80 episodes diverged. The non-circular moving-block bootstrap draws that episode only in
    # the one block starting at n - L, so most replicates miss it; circular blocks draw every episode with equal
    # probability (L / n per block), and the interval's upper end lies above the estimate 1/80.
    x = [0] * 79 + [1]
    low, high = block_bootstrap_interval(x)
    assert low == 0.0 and high > 1 / 80
    # by symmetry the first episode is treated the same way as the last
    assert block_bootstrap_interval([1] + [0] * 79)[1] > 1 / 80


def test_bootstrap_width_grows_with_block_length_when_autocorrelated():
    x = _markov_flags(400, 0.9, seed=5)
    widths = [np.subtract(*block_bootstrap_interval(x, block_length=L)[::-1]) for L in (1, 5, 20)]
    assert widths[0] < widths[1] < widths[2]


@pytest.mark.parametrize("block_length", [1, 5])
def test_bootstrap_covers_true_mean_for_iid(block_length):
    rng = np.random.default_rng(2024)
    p, n, reps = 0.3, 100, 300
    hits = 0
    for i in range(reps):
        x = (rng.random(n) < p).astype(int)
        low, high = block_bootstrap_interval(x, block_length=block_length, n_boot=2000, seed=i)
        hits += low <= p <= high
    # nominal 95 %; percentile bootstrap at n = 100 is a little liberal. With 300
    # replicates the binomial sd of the coverage is ~1.3 %, so 0.88..0.99 is wide.
    assert 0.88 <= hits / reps <= 0.99


def _block_bootstrap_reference(flags, block_length=5, n_boot=10_000, confidence=0.95, seed=42):
    """The interval as first written: every replicate's blocks gathered from the prefix sum and added up."""
    x = np.asarray(flags, dtype=float).ravel()
    n = x.size
    L = min(int(block_length), max(1, n // 2))
    n_blocks = math.ceil(n / L)
    tail = n - (n_blocks - 1) * L
    csum = np.concatenate(([0.0], np.cumsum(np.concatenate((x, x[:L])))))
    starts = np.random.default_rng(seed).integers(0, n, size=(n_boot, n_blocks))
    full = (csum[starts[:, :-1] + L] - csum[starts[:, :-1]]).sum(axis=1)
    last = csum[starts[:, -1] + tail] - csum[starts[:, -1]]
    low, high = np.quantile((full + last) / n, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return float(low), float(high)


@pytest.mark.parametrize(
    "n, block_length, n_boot, seed",
    [
        (80, 5, 10_000, 42),
        (80, 5, 10_000, 42),
        (81, 5, 999, 3),
        (7, 5, 500, 1),
        (1, 5, 200, 0),
        (2, 1, 300, 9),
        (400, 20, 2000, 42),
        (160, 5, 10_000, 42),
    ],
)
def test_bootstrap_equals_the_gathering_reference_float_for_float(n, block_length, n_boot, seed):
    # block sums of 0/1 flags are small integers, exact in any order: the table lookup (and the kept draws, asked
    # twice for n = 80) give the very floats of the first implementation
    for i, stay in enumerate((0.5, 0.9)):
        x = _markov_flags(n, stay, seed=seed + i) if n > 1 else np.array([1])
        for confidence in (0.95, 0.9):
            assert block_bootstrap_interval(x, block_length, n_boot, confidence, seed) == _block_bootstrap_reference(
                x, block_length, n_boot, confidence, seed
            )


def test_bootstrap_short_sequences():
    # n < block_length: L is capped at n // 2 = 2, so replicates mix blocks
    # (block means 1, 0.5, 0, 0) and the interval is not degenerate.
    low, high = block_bootstrap_interval([1, 1, 0, 0, 0], block_length=5)
    assert 0.0 <= low < high <= 1.0
    assert block_bootstrap_interval([1], block_length=5) == (1.0, 1.0)
    with pytest.raises(ValueError):
        block_bootstrap_interval([])
    with pytest.raises(ValueError):
        block_bootstrap_interval([0, 2, 1])


# --- Cochran-Armitage -----------------------------------------------------


def test_cochran_armitage_hand_worked():
    # k = (1, 2, 3), n = (4, 4, 4), scores (0, 1, 2); p = 6/12 = 0.5
    # T = 0*(1-2) + 1*(2-2) + 2*(3-2) = 2
    # Var = 0.25 * [4*(0+1+4) - (4*(0+1+2))^2 / 12] = 0.25 * (20 - 12) = 2
    # z = 2 / sqrt(2) = 1.414214; p = 2 * (1 - Phi(1.414214)) = 0.157299
    z, p = cochran_armitage([1, 2, 3], [4, 4, 4])
    assert z == pytest.approx(1.414214, abs=1e-6)
    assert p == pytest.approx(0.157299, abs=1e-6)
    # reversing the order reverses the sign only
    z_rev, p_rev = cochran_armitage([3, 2, 1], [4, 4, 4])
    assert z_rev == pytest.approx(-z) and p_rev == pytest.approx(p)


# Agresti, Categorical Data Analysis, 2nd ed. (2002), sec. 3.4, Table 3.7 (infant
# malformation by mother's alcohol consumption, from Graubard & Korn 1987).
MALFORMED = [48, 38, 5, 1, 1]
ABSENT = [17066, 14464, 788, 126, 37]
TOTAL = [a + b for a, b in zip(MALFORMED, ABSENT)]


@pytest.mark.parametrize(
    "scores, m2, p_ref",
    [
        ((0, 0.5, 1.5, 4.0, 7.0), 6.57, 0.0104),  # Agresti: M^2 = 6.57, P = 0.01
        ((0, 1, 2, 3, 4), 1.83, 0.176),  # Agresti: equally spaced scores, M^2 = 1.83, P = 0.18
    ],
)
def test_cochran_armitage_agresti_malformation(scores, m2, p_ref):
    # Agresti reports M^2 = (N-1) r^2; Cochran-Armitage z^2 = N r^2. At N = 32574
    # the two agree to 3 significant digits.
    z, p = cochran_armitage(MALFORMED, TOTAL, scores)
    assert z > 0
    assert z**2 == pytest.approx(m2, abs=0.005)
    assert p == pytest.approx(p_ref, abs=0.0005)


def test_cochran_armitage_equals_correlation_on_items():
    # Different method: expand to one row per item and use Pearson r; z = sqrt(N) r.
    k, n, s = [3, 9, 14, 15], [40, 40, 40, 40], [0, 1, 2, 3]
    score = np.repeat(s, n)
    outcome = np.concatenate([[1] * ki + [0] * (ni - ki) for ki, ni in zip(k, n)])
    r = np.corrcoef(score, outcome)[0, 1]
    z, _ = cochran_armitage(k, n, s)
    assert z == pytest.approx(math.sqrt(len(score)) * r, rel=1e-10)


def test_cochran_armitage_paper_setting_qualitative():
    # Paper sec. IV-D: Qwen2.5-7B ON-vs-OFF rises F16 36.2 % -> Q4_K_M 75.0 % (80 episodes
    # each; Q8_0 and Q3_K_M values are not in the summary) and the trend test is highly
    # significant (z = 5.68). The two reported levels alone, 29/80 vs 60/80, already
    # give a significant positive trend; reversing the order flips the sign.
    z, p = cochran_armitage([29, 60], [80, 80])
    assert z > 4 and p < 1e-4
    z_rev, _ = cochran_armitage([60, 29], [80, 80])
    assert z_rev < -4
    # A flat profile carries no trend.
    z_flat, p_flat = cochran_armitage([30, 30, 30, 30], [80, 80, 80, 80])
    assert z_flat == pytest.approx(0.0) and p_flat == pytest.approx(1.0)


def test_cochran_armitage_degenerate_inputs():
    assert cochran_armitage([0, 0, 0], [80, 80, 80]) == (0.0, 1.0)
    with pytest.raises(ValueError):
        cochran_armitage([1], [4])
    with pytest.raises(ValueError):
        cochran_armitage([1, 2], [4, 4], scores=[1, 1])


# --- McNemar --------------------------------------------------------------


def test_mcnemar_paper_13_vs_7():
    # 2 * P(X <= 7), X ~ Bin(20, 1/2) = 2 * sum_{i<=7} C(20, i) / 2^20
    # = 2 * 137980 / 1048576 = 0.263176
    tail = sum(math.comb(20, i) for i in range(8))
    assert tail == 137980
    assert mcnemar_exact(13, 7) == pytest.approx(2 * tail / 2**20, rel=1e-12)
    assert round(mcnemar_exact(13, 7), 4) == 0.2632
    assert mcnemar_exact(7, 13) == pytest.approx(mcnemar_exact(13, 7))


def test_mcnemar_small_cases():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0
    # 0 vs 6: 2 * (1/2)^6 = 0.03125
    assert mcnemar_exact(0, 6) == pytest.approx(0.03125)
    # 1 vs 9: 2 * (1 + 10) / 1024 = 0.021484375
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)


def _power_by_enumeration(n, r, shift, alpha):
    """Independent reference: enumerate every (b, c) with math.comb in pure Python."""
    p_b = (r + shift) / (2 * r)
    total = 0.0
    for d in range(n + 1):
        p_d = math.comb(n, d) * r**d * (1 - r) ** (n - d)
        for b in range(d + 1):
            lo = min(b, d - b)
            p_value = min(1.0, 2 * sum(math.comb(d, i) for i in range(lo + 1)) / 2**d)
            if p_value <= alpha:
                total += p_d * math.comb(d, b) * p_b**b * (1 - p_b) ** (d - b)
    return total


@pytest.mark.parametrize("n, r, shift", [(30, 0.3, 0.1), (40, 0.5, -0.2), (25, 0.2, 0.0)])
def test_mcnemar_power_matches_enumeration(n, r, shift):
    assert mcnemar_power(n, r, shift) == pytest.approx(_power_by_enumeration(n, r, shift, 0.05), abs=1e-12)


def test_mcnemar_power_properties():
    # No shift: power is the test's size, which the exact test keeps below alpha.
    assert 0 < mcnemar_power(1300, 20 / 1300, 0.0) <= 0.05
    # More items, more power; the sign of the shift does not matter.
    assert mcnemar_power(600, 0.0154, 0.01) < mcnemar_power(1300, 0.0154, 0.01) < mcnemar_power(3000, 0.0154, 0.01)
    assert mcnemar_power(1300, 0.0154, -0.01) == pytest.approx(mcnemar_power(1300, 0.0154, 0.01))
    # All discordant pairs on one side: power -> 1 for large n.
    assert mcnemar_power(1300, 0.0154, 0.0154) > 0.999


def test_mcnemar_power_paper_setting():
    # Paper sec. IV-F: "At the observed discordant rate of 1.54%, the power to detect a
    # 1 pp net accuracy shift is 81%." Unconditional reading (D ~ Bin(1300, 0.0154))
    # gives 0.812; conditioning on D = 20 would give 0.877 instead.
    assert round(mcnemar_power(1300, 0.0154, 0.01), 2) == 0.81
    assert round(mcnemar_power(1300, 20 / 1300, 0.01), 2) == 0.81
    # D = 20 fixed: 2 P(X <= 5) = 2 * 21700 / 2^20 = 0.041 <= 0.05 but 2 P(X <= 6) = 0.115,
    # so reject iff b <= 5 or b >= 15, with b ~ Bin(20, (0.0154 + 0.01) / 0.0308).
    assert sum(math.comb(20, i) for i in range(6)) == 21700
    p_b = (0.0154 + 0.01) / 0.0308
    cond = sum(math.comb(20, b) * p_b**b * (1 - p_b) ** (20 - b) for b in list(range(6)) + list(range(15, 21)))
    assert round(cond, 2) == 0.88


def test_mcnemar_power_rejects_bad_input():
    with pytest.raises(ValueError):
        mcnemar_power(100, 0.01, 0.02)
    with pytest.raises(ValueError):
        mcnemar_power(100, 0.0, 0.0)


# --- Cochran-Mantel-Haenszel ------------------------------------------------


@pytest.mark.parametrize("table", [(12, 5, 4, 11), (3, 17, 1, 19), (30, 70, 18, 82)])
def test_mantel_haenszel_of_one_stratum_is_yates_chi_square_scaled_by_n_minus_1_over_n(table):
    a, b, c, d = table
    n = a + b + c + d
    chi2 = stats.chi2_contingency([[a, b], [c, d]], correction=True)[0]
    _, p = mantel_haenszel([table], alternative="two-sided")
    z = stats.norm.isf(p / 2)
    assert z * z == pytest.approx(chi2 * (n - 1) / n, rel=1e-9)
    odds, _ = mantel_haenszel([table])
    assert odds == pytest.approx(a * d / (b * c))


def test_mantel_haenszel_one_sided_halves_the_two_sided_in_the_observed_direction():
    t = [(12, 5, 4, 11), (9, 8, 5, 12)]
    _, two = mantel_haenszel(t, alternative="two-sided")
    _, greater = mantel_haenszel(t, alternative="greater")
    _, less = mantel_haenszel(t, alternative="less")
    assert greater == pytest.approx(two / 2) and less > 0.5


def test_mantel_haenszel_skips_strata_without_information_and_pools_the_rest():
    informative = [(12, 5, 4, 11)]
    empty = [(0, 0, 0, 0), (3, 0, 2, 0), (0, 4, 0, 6)]  # no units, no non-events, no events
    assert mantel_haenszel(informative + empty) == mantel_haenszel(informative)
    assert mantel_haenszel(empty) == (pytest.approx(float("nan"), nan_ok=True), 1.0)
    with pytest.raises(ValueError):
        mantel_haenszel([(1, -1, 0, 0)])


def test_wilson_equals_scipys_binomtest_interval_float_for_float():
    """wilson_interval computes scipy's own Wilson interval without binomtest's exact p-value: held to
    binomtest's interval, float for float, so a scipy upgrade that changes either shows here."""
    from scipy.stats import binomtest

    for n in (*range(1, 121), 399, 1000, 100_000):
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n} & set(range(n + 1))):
            for confidence in (0.9, 0.95, 0.99):
                ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
                assert wilson_interval(k, n, confidence) == (float(ci.low), float(ci.high)), (k, n, confidence)


# --- the normal tail without scipy.stats ------------------------------------


def test_normal_sf_is_scipy_norm_sf_float_for_float():
    """normal_sf is scipy.stats.norm.sf as scipy computes it, the same float (check's tables use it so as not to
    import scipy.stats before the figures): across the range of z a p-value takes, and at its edges; a scipy
    upgrade that computed the tail otherwise shows here."""
    rng = np.random.default_rng(7)
    zs = np.concatenate(
        [
            rng.normal(0, 3, 3000),
            rng.uniform(-40, 40, 1000),
            [0.0, -0.0, 1e-300, 5e-324, 8.3, 37.5, 38.5, -38.5, np.inf, -np.inf],
        ]
    )
    ours = [float(normal_sf(z)) for z in zs]
    theirs = stats.norm.sf(zs).tolist()
    assert ours == theirs
    assert float(2 * normal_sf(abs(-1.7))) == float(2 * stats.norm.sf(1.7))


def test_mcnemar_items_for_power_is_the_first_crossing():
    """How many items a 1 pp shift needs for power 0.80: the paper's 1300 items at its 1.54 % discordant rate were
    enough (0.81), 1265 are the first the search finds at 0.80; where answers flip more often, more items are needed."""
    n = mcnemar_items_for_power(20 / 1300, 0.01)
    assert n == 1265 and mcnemar_power(n, 20 / 1300, 0.01) >= 0.80 > mcnemar_power(n - 1, 20 / 1300, 0.01)
    assert mcnemar_items_for_power(0.01, 0.01) < n < mcnemar_items_for_power(41 / 800, 0.01) == 4188
    assert mcnemar_power(4188, 41 / 800, 0.01) >= 0.80 > mcnemar_power(800, 41 / 800, 0.01)
    assert mcnemar_items_for_power(0.5, 0.001, n_max=10_000) is None  # beyond the search: said, not guessed
    with pytest.raises(ValueError):
        mcnemar_items_for_power(0.05, 0.0)
