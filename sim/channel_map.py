"""The PTD channel map of the simulation build, and the model file of ``qlink sim --model``.

``qlink sim --qubits Q`` (1..:data:`~openqlink.sim.qubit.MAX_QUBITS`) puts a
:class:`~openqlink.sim.qubit.QubitSystem` of Q qubits behind each PPU's PTD port and sizes the
build to match (:func:`sim_params`):

=====================  ==========================  ==========================================
PTD channel            program                     model
=====================  ==========================  ==========================================
drive ``q``            ``play q, ...``             qubit ``q``'s drive (``q`` in 0..Q-1)
drive ``Q + q``        ``play Q+q, ...``           the coupler of qubits ``q`` and ``q + 1``
                                                   (``q`` in 0..Q-2): its samples go to
                                                   :meth:`QubitSystem.couple`
readout ``q``          ``acquire q, ...``          qubit ``q``'s dispersive readout
=====================  ==========================  ==========================================

so the build has ``drives_per_ppu = 2Q - 1`` and ``readouts_per_ppu = Q`` (with Q = 1: one
drive and one readout, the default build).

The model file is a JSON object; every key is optional and a parameter left out keeps
:class:`~openqlink.sim.qubit.QubitSystem`'s default:

``qubits``
    The qubits' :class:`~openqlink.sim.qubit.QubitParams`: one object for every qubit, or a
    list of exactly Q objects (entry ``q`` for qubit ``q``), with the keys ``if_hz`` (Hz),
    ``t1_ns``, ``t2_ns`` (ns; ``null`` for none) and ``pi_area`` (full-scale units).
``readouts``
    The readout channels' :class:`~openqlink.sim.qubit.Readout`: one object for every
    channel, or a list of Q, with ``ro_if_hz`` (Hz), ``readout_amplitude`` (ADC codes),
    ``phase0_rad``, ``phase1_rad`` (rad) and ``noise_sigma`` (ADC codes).
``couplers``
    The couplers' :class:`~openqlink.sim.qubit.Coupler`: one object for every coupler, or a
    list of Q - 1, with ``cz_area`` (full-scale units).
``trotter_fraction``
    :class:`~openqlink.sim.qubit.QubitSystem`'s ``trotter_fraction``.

A key that is not one of these is an error naming it; so is a list of another length or a
value the model refuses (``t2_ns`` above ``2 * t1_ns``, an IF beyond the Nyquist frequency).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import QlinkError
from ..memory_map import QSCParams
from .qubit import MAX_QUBITS, Coupler, QubitParams, QubitSystem, Readout

__all__ = [
    "ModelError", "QUBIT_KEYS", "READOUT_KEYS", "COUPLER_KEYS", "MODEL_KEYS", "sim_params",
    "check_build", "channel_map", "channel_roles", "check_model", "load_model", "make_system",
]

#: The keys of one entry of ``qubits`` (the fields of QubitParams).
QUBIT_KEYS = ("if_hz", "t1_ns", "t2_ns", "pi_area")
#: The keys of one entry of ``readouts`` (the fields of Readout but ``qubit``: the map's).
READOUT_KEYS = ("ro_if_hz", "readout_amplitude", "phase0_rad", "phase1_rad", "noise_sigma")
#: The keys of one entry of ``couplers`` (the fields of Coupler but ``a``, ``b``: the map's).
COUPLER_KEYS = ("cz_area",)
#: The model file's top-level keys.
MODEL_KEYS = ("qubits", "readouts", "couplers", "trotter_fraction")

#: Keys whose ``null`` means infinity (no decay).
_INFINITE_WHEN_NULL = ("t1_ns", "t2_ns")


class ModelError(QlinkError, ValueError):
    """A model file, or a qubit count, that the bench cannot use; the message names the key."""


def _check_qubits(qubits: object) -> int:
    if isinstance(qubits, bool) or not isinstance(qubits, int) or \
            not 1 <= qubits <= MAX_QUBITS:
        raise ModelError(f"qubits must be 1..{MAX_QUBITS}, not {qubits!r}")
    return qubits


def sim_params(num_ppus: int = 1, qubits: int = 1, samples_per_cycle: int = 1,
               **overrides: Any) -> QSCParams:
    """The simulation build for ``qubits`` qubits per PPU: ``2 * qubits - 1`` drive channels
    (drives, then couplers) and ``qubits`` readout channels per PPU, ``samples_per_cycle``
    PTD samples per DTD cycle; ``overrides`` are further :class:`QSCParams` fields."""
    q = _check_qubits(qubits)
    return QSCParams(num_ppus=num_ppus, drives_per_ppu=2 * q - 1, readouts_per_ppu=q,
                     samples_per_cycle=samples_per_cycle, **overrides)


def check_build(params: QSCParams, qubits: int) -> None:
    """Raise :class:`ModelError` unless ``params`` has the channels the map of ``qubits``
    qubits needs (``2 * qubits - 1`` drive and ``qubits`` readout channels per PPU)."""
    q = _check_qubits(qubits)
    if (params.drives_per_ppu, params.readouts_per_ppu) != (2 * q - 1, q):
        raise ModelError(
            f"{q} qubit(s) per PPU map onto {2 * q - 1} drive and {q} readout channel(s), "
            f"but the build has {params.drives_per_ppu} and {params.readouts_per_ppu} "
            f"(build it with openqlink.sim.channel_map.sim_params(qubits={q}))")


def channel_roles(qubits: int) -> list[tuple[str, tuple[int, ...]]]:
    """Per drive channel, PTD channel order: ``("drive", (q,))`` or
    ``("coupler", (q, q + 1))``."""
    q = _check_qubits(qubits)
    return ([("drive", (i,)) for i in range(q)]
            + [("coupler", (i, i + 1)) for i in range(q - 1)])


def channel_map(qubits: int) -> dict:
    """The map of PTD channels onto the model of ``qubits`` qubits, as JSON-safe data:
    ``{"qubits": Q, "drive": [{"channel", "role", "qubit" | "qubits", ...}], "readout":
    [{"channel", "qubit"}]}``; a coupler's entry names its index in the model
    (``coupler``)."""
    q = _check_qubits(qubits)
    drive: list[dict] = []
    for ch, (role, targets) in enumerate(channel_roles(q)):
        if role == "drive":
            drive.append({"channel": ch, "role": role, "qubit": targets[0]})
        else:
            drive.append({"channel": ch, "role": role, "coupler": ch - q,
                          "qubits": list(targets)})
    return {"qubits": q, "drive": drive,
            "readout": [{"channel": ch, "qubit": ch} for ch in range(q)]}


def _number(where: str, value: object, key: str) -> float:
    if value is None and key in _INFINITE_WHEN_NULL:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelError(f"{where}.{key} must be a number"
                         + (" or null" if key in _INFINITE_WHEN_NULL else "")
                         + f", not {value!r}")
    return float(value)


def _entries(model: Mapping, name: str, keys: tuple[str, ...], count: int) -> list[dict]:
    """The ``count`` entries of section ``name`` (each a dict of floats; infinity for null)."""
    section = model.get(name, {})
    if isinstance(section, Mapping):
        raw = [section] * count
        where = [name] * count
    elif isinstance(section, list):
        if len(section) != count:
            raise ModelError(f"{name} is a list of {len(section)}, not {count} (one entry per "
                             f"{name[:-1]} of the model, or one object for every one)")
        raw = section
        where = [f"{name}[{i}]" for i in range(count)]
    else:
        raise ModelError(f"{name} must be an object or a list of objects, not {section!r}")
    out = []
    for w, entry in zip(where, raw, strict=True):
        if not isinstance(entry, Mapping):
            raise ModelError(f"{w} must be an object, not {entry!r}")
        for key in entry:
            if key not in keys:
                raise ModelError(f"{w}: unknown key {key!r} (known: {', '.join(keys)})")
        out.append({key: _number(w, entry[key], key) for key in keys if key in entry})
    return out


def check_model(model: Mapping, qubits: int) -> dict:
    """Check a model file's object for ``qubits`` qubits and return it expanded: ``qubits``
    and ``readouts`` lists of ``qubits`` entries, ``couplers`` of ``qubits - 1``, each entry
    holding only the parameters given (as floats; infinite T1/T2 as None, JSON-safe), and
    ``trotter_fraction`` when given. Raises :class:`ModelError` naming the bad key."""
    q = _check_qubits(qubits)
    if not isinstance(model, Mapping):
        raise ModelError(f"the model must be a JSON object, not {model!r}")
    for key in model:
        if key not in MODEL_KEYS:
            raise ModelError(f"unknown key {key!r} (known: {', '.join(MODEL_KEYS)})")
    out: dict[str, Any] = {
        "qubits": _entries(model, "qubits", QUBIT_KEYS, q),
        "readouts": _entries(model, "readouts", READOUT_KEYS, q),
        "couplers": _entries(model, "couplers", COUPLER_KEYS, q - 1),
    }
    if "trotter_fraction" in model:
        out["trotter_fraction"] = _number("model", model["trotter_fraction"],
                                          "trotter_fraction")
    # Each entry must make its model object (e.g. T2 <= 2 T1): name the entry when not.
    for name, cls in (("qubits", QubitParams), ("readouts", Readout), ("couplers", Coupler)):
        for i, entry in enumerate(out[name]):
            extra = {"a": i, "b": i + 1} if cls is Coupler else {}
            try:
                cls(**extra, **entry)
            except ValueError as exc:
                raise ModelError(f"{name}[{i}]: {exc}") from None
    for entries in (out["qubits"], out["readouts"], out["couplers"]):
        for entry in entries:
            for key, value in entry.items():
                if math.isinf(value):
                    entry[key] = None
    return out


def load_model(path: str | Path, qubits: int) -> dict:
    """Read and check the model file ``path`` (:func:`check_model`); errors name the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: {exc}") from None
    try:
        return check_model(data, qubits)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from None


def _floats(entry: Mapping) -> dict[str, float]:
    return {k: math.inf if v is None else float(v) for k, v in entry.items()}


def make_system(model: Mapping | None, qubits: int, *, seed: int,
                sample_rate_hz: float) -> QubitSystem:
    """The :class:`QubitSystem` of one PPU: ``qubits`` qubits, readout channel ``q`` on qubit
    ``q``, coupler ``q`` between qubits ``q`` and ``q + 1``, parameters from ``model`` (a
    model file's object, checked with :func:`check_model`; None for the defaults),
    ``sample_rate_hz`` PTD samples per second. Raises :class:`ModelError` for a model the
    system refuses (an IF beyond ``sample_rate_hz / 2``)."""
    m = check_model(model or {}, qubits)
    extra = {"trotter_fraction": m["trotter_fraction"]} if "trotter_fraction" in m else {}
    try:
        return QubitSystem(
            [QubitParams(**_floats(e)) for e in m["qubits"]],
            sample_rate_hz=sample_rate_hz,
            readouts=[Readout(qubit=q, **_floats(e)) for q, e in enumerate(m["readouts"])],
            couplers=[Coupler(q, q + 1, **_floats(e)) for q, e in enumerate(m["couplers"])],
            seed=seed, **extra)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
