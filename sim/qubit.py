"""A seeded single-qubit and dispersive-readout model for the bench (the PTD side of a PPU).

The qubit is driven on resonance about X, so its state stays on the Y=0 great circle and is
fully described by the rotation angle ``theta`` from ``|0>``: ``P(1) = sin^2(theta/2)``. Each DAC
sample ``s`` (signed 16-bit, full scale 32767) rotates the qubit by
``pi * s / pi_area`` radians, so a pulse whose samples add up to ``pi_area`` is a pi pulse.

A readout window projects the qubit: the outcome is 1 with probability ``P(1)`` (drawn from a
``random.Random(seed)``, so a run is reproducible), the state collapses to ``|outcome>``, and for
the whole window the ADC carries ``+readout_amplitude`` (outcome 1) or ``-readout_amplitude``
(outcome 0) plus Gaussian noise of ``noise_sigma`` (also seeded), clipped to 16 bits. The PPU's
ACQUIRE integrates these samples and thresholds the sum.

This is a model of physics, not of the gateware: nothing here does a PPU's job.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

__all__ = ["QubitModel", "Measurement"]


@dataclass
class Measurement:
    """One projective measurement: the outcome and the P(1) it was drawn from."""

    outcome: int
    p1: float
    dtd_cycle: int


@dataclass
class QubitModel:
    """Seeded qubit + readout model. See the module docstring for the physics.

    Parameters
    ----------
    seed : int
        Seed of the outcome and noise generators.
    pi_area : float
        Sum of DAC samples (full scale 32767) that makes a pi rotation. The default is the area
        of the 64-sample gaussian (sigma 16) of ``firmware/active_reset.s`` at amplitude 1.0, the
        pulse that program calls its pi pulse (its calibration, in a lab's terms).
    readout_amplitude : int
        Mean ADC sample during a readout window, sign set by the outcome.
    noise_sigma : float
        Standard deviation of the ADC noise, in ADC codes.
    """

    seed: int = 1
    pi_area: float = 1_254_378
    readout_amplitude: int = 2000
    noise_sigma: float = 300.0
    theta: float = 0.0
    measurements: list[Measurement] = field(default_factory=list)

    def __post_init__(self):
        self._rng = random.Random(self.seed)
        self._outcome: int | None = None

    @property
    def p1(self) -> float:
        """Probability of measuring 1 now."""
        return math.sin(self.theta / 2) ** 2

    def drive(self, sample: int) -> None:
        """Apply one DAC sample of the drive channel."""
        self.theta = (self.theta + math.pi * sample / self.pi_area) % (2 * math.pi)

    def begin_readout(self, dtd_cycle: int) -> int:
        """Project the qubit at the start of a readout window; returns the outcome."""
        p1 = self.p1
        outcome = int(self._rng.random() < p1)
        self.theta = math.pi if outcome else 0.0
        self._outcome = outcome
        self.measurements.append(Measurement(outcome, p1, dtd_cycle))
        return outcome

    def adc_sample(self) -> int:
        """The ADC I sample during the current readout window (0 outside one)."""
        if self._outcome is None:
            return 0
        mean = self.readout_amplitude if self._outcome else -self.readout_amplitude
        value = round(mean + self._rng.gauss(0.0, self.noise_sigma))
        return max(-32768, min(32767, value))

    def end_readout(self) -> None:
        self._outcome = None
