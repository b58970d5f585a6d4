"""Least-squares fit of a fringe's frequency, for the tests of Ramsey-like sweeps."""

from __future__ import annotations

import math
from collections.abc import Sequence


def fringe_frequency(taus_s: Sequence[float], values: Sequence[float],
                     lo_hz: float = 0.2e6, hi_hz: float = 20e6) -> float:
    """Frequency (Hz) of the sinusoid + offset that fits ``values`` at ``taus_s`` best (least
    squares on a grid of 50 kHz steps from ``lo_hz`` to ``hi_hz``, then of 1 kHz steps around
    the best). Keep ``hi_hz`` below the sampling's Nyquist frequency: aliases fit as well."""
    coarse = min(_residual(taus_s, values, lo_hz + step * 50e3)
                 for step in range(round((hi_hz - lo_hz) / 50e3) + 1))[1]
    return min(_residual(taus_s, values, coarse + step * 1e3) for step in range(-50, 51))[1]


def _residual(taus_s: Sequence[float], values: Sequence[float], f: float) -> tuple[float, float]:
    """(sum of squared residuals, f) of the least-squares fit of ``c + a cos + b sin`` at f."""
    cols = [[1.0] * len(taus_s), [math.cos(2 * math.pi * f * t) for t in taus_s],
            [math.sin(2 * math.pi * f * t) for t in taus_s]]
    gram = [[sum(a * b for a, b in zip(u, v, strict=True)) for v in cols] for u in cols]
    rhs = [sum(a * y for a, y in zip(u, values, strict=True)) for u in cols]
    coef = _solve3(gram, rhs)
    resid = sum((y - sum(c * col[i] for c, col in zip(coef, cols, strict=True))) ** 2
                for i, y in enumerate(values))
    return resid, f


def _solve3(a: list[list[float]], b: list[float]) -> list[float]:
    """Cramer's rule for a 3 x 3 system."""
    def det(m):
        return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
                - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
    d = det(a)
    return [det([[b[r] if c == k else a[r][c] for c in range(3)] for r in range(3)]) / d
            for k in range(3)]
