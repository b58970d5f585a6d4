"""The kernel front end without a simulation: the assembly each construct becomes, the gates'
math against a state-vector reference, the generated function table, and the errors naming
the kernel's source line."""

from __future__ import annotations

import importlib.util
import math
import re
import textwrap
from dataclasses import replace

import numpy as np
import pytest

import openqlink
from openqlink import kernels
from openqlink.calibration import CalibrationTable
from openqlink.dispatch import DispatchMode, TypeDesc
from openqlink.isa import disassemble
from openqlink.kernels import KernelCompileError, kernel
from openqlink.kernels.compiler import EVENT_LEAD_CYCLES, RESULT_LANDING_CYCLES
from openqlink.memory_map import QSCParams
from openqlink.sim.channel_map import sim_params
from openqlink.wire.rpc import fnv1a32

P1 = sim_params(1, 1)
T1 = CalibrationTable.for_simulation(1, P1)
P2 = sim_params(1, 2)
T2 = CalibrationTable.for_simulation(2, P2)

HEADER = """\
from openqlink.kernels import (kernel, qubit, qvector, x, y, z, h, s, t, rx, ry, rz, cz, mz,
                               device_call)

def adder(i: int, r: int) -> int:
    return i + r

def flag(b: bool) -> bool:
    return not b

def nohints(i):
    return i

def log(i: int) -> None:
    pass
"""


@pytest.fixture
def load(tmp_path):
    """Make a module of kernels from source (a file, so that their lines are known)."""
    count = [0]

    def make(body: str):
        count[0] += 1
        path = tmp_path / f"kernels_{count[0]}.py"
        path.write_text(HEADER + textwrap.dedent(body))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, path
    return make


def _code(compiled) -> list[str]:
    """The instruction lines of the assembly, comments and directives left out."""
    return [line.strip() for line in compiled.assembly.splitlines()
            if line.startswith("        ")]


def _line_of(path, text: str) -> int:
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return n
    raise AssertionError(text)


# --- the seed kernel and the function table ----------------------------------------------------

def test_the_seed_kernel_lowers_to_h_acquire_call_and_reads_its_result(load):
    mod, path = load("""
        @kernel
        def seed(i: int):
            q = qubit()
            h(q)
            r = mz(q)
            return device_call(adder, i, r)
    """)
    c = mod.seed.compile(T1, 7, params=P1)
    # h = a virtual Z (frame +pi) then RY(pi/2): phase pi/2 - pi = -pi/2 = 49152 / 65536 turn
    assert _code(c) == ["play 0, gauss0, amp=0.500000000, phase=49152", "wait 64",
                        "acquire 0, r1, window=100, threshold=0", "wait 100",
                        "set r2, 7", "call adder(r2:32, r1:32) -> r3", "sync SLACK", "end"]
    assert f"; {path.name}:{_line_of(path, 'h(q)')}: h(q)" in c.assembly
    assert c.measurements == {"r": 1}
    assert c.result_value({"R3": 8}) == 8 and c.result_value({"R3": 0xFFFF_FFFF}) == -1
    (entry,) = c.function_table.entries()
    assert entry.name == "adder" and entry.mode == DispatchMode.HOST_CALL
    assert entry.function_id == fnv1a32("adder") == c.program.functions["adder"]
    assert entry.args == (TypeDesc.int32(), TypeDesc.int32())
    assert entry.results == (TypeDesc.int32(),)
    assert entry.handler(7, 1) == 8
    # the program is the assembly, assembled for the build
    assert len(c.program.instructions) == 8
    assert "call adder(r2:32, r1:32) -> r3" in disassemble(c.program.instructions,
                                                           functions=c.program.functions)


def test_bool_hints_are_uint8_and_reach_the_handler_as_bools(load):
    mod, _ = load("""
        @kernel
        def k():
            q = qubit()
            m = mz(q)
            return device_call(flag, m)
    """)
    c = mod.k.compile(T1, params=P1)
    (entry,) = c.function_table.entries()
    assert entry.args == (TypeDesc.uint8(),) and entry.results == (TypeDesc.uint8(),)
    assert entry.handler(1) is False and entry.handler(0) is True
    assert "call flag(r1:8) -> r2" in _code(c)


def test_a_device_call_without_result_is_a_statement(load):
    mod, _ = load("""
        @kernel
        def k():
            q = qubit()
            device_call(log, 7)
    """)
    c = mod.k.compile(T1, params=P1)
    assert _code(c) == ["set r1, 7", "call log(r1:32)", "sync SLACK", "end"]
    assert c.function_table["log"].results == ()


def test_the_library_exports_the_language_lazily():
    assert openqlink.kernel is kernels.kernel and openqlink.mz is kernels.mz
    assert openqlink.device_call is kernels.device_call
    with pytest.raises(AttributeError):
        openqlink.not_a_gate  # noqa: B018


# --- every gate --------------------------------------------------------------------------------

@pytest.mark.parametrize("gate, expect", [
    ("x(q)", ["play 0, gauss0, amp=1.000000000", "wait 64"]),
    ("y(q)", ["play 0, gauss0, amp=1.000000000, phase=16384", "wait 64"]),
    ("rx(0.5, q)", [f"play 0, gauss0, amp={0.5 / math.pi:.9f}", "wait 64"]),
    ("rx(-0.5, q)", [f"play 0, gauss0, amp={-0.5 / math.pi:.9f}", "wait 64"]),
    ("ry(theta, q)", [f"play 0, gauss0, amp={1.25 / math.pi:.9f}, phase=16384", "wait 64"]),
    ("rx(2 * pi, q)", []),                       # a whole turn: no pulse
    ("z(q)", []), ("s(q)", []), ("t(q)", []), ("rz(theta, q)", []),
    ("z(q); x(q)", ["play 0, gauss0, amp=1.000000000, phase=32768", "wait 64"]),
    ("s(q); x(q)", ["play 0, gauss0, amp=1.000000000, phase=49152", "wait 64"]),
    ("t(q); x(q)", ["play 0, gauss0, amp=1.000000000, phase=57344", "wait 64"]),
    ("rz(theta, q); x(q)", [f"play 0, gauss0, amp=1.000000000, "
                            f"phase={round(-1.25 / (2 * math.pi) * 65536) % 65536}", "wait 64"]),
])
def test_each_one_qubit_gate(load, gate, expect):
    mod, _ = load(f"""
        from math import pi

        @kernel
        def k(theta: float):
            q = qubit()
            {gate}
    """)
    c = mod.k.compile(T1, 1.25, params=P1)
    assert _code(c) == expect + ["end"]


def test_gates_use_the_tables_channels_frequencies_and_pi_amplitude(load):
    mod, _ = load("""
        @kernel
        def k():
            qs = qvector(2)
            x(qs[1])
            m = mz(qs[1])
    """)
    qubits = [replace(q, pi_amplitude=0.8, drive_if_hz=-12.5e6, readout_if_hz=25e6,
                      readout_phase_rad=math.pi / 2, readout_threshold=-7,
                      readout_window_ns=200.0) for q in T2.qubits]
    table = CalibrationTable(qubits, T2.couplers)
    c = mod.k.compile(table, params=P2)
    fw = round(-12.5e6 / 250e6 * 2**32) % 2**32
    assert _code(c) == [f"play 1, gauss0, amp=0.800000000, freq={fw}", "wait 64",
                        f"acquire 1, r1, window=50, threshold=-7, phase=16384, "
                        f"freq={round(2**32 / 10)}", "wait 50", "end"]


def test_cz_plays_the_couplers_pulse(load):
    mod, _ = load("""
        @kernel
        def k():
            a = qubit()
            b = qubit()
            cz(b, a)
    """)
    c = mod.k.compile(T2, params=P2)
    assert _code(c) == ["play 2, gauss0, amp=1.0", "wait 64", "end"]


def test_envelopes_are_one_per_pulse_shape(load):
    mod, _ = load("""
        @kernel
        def k():
            qs = qvector(2)
            x(qs[0])
            x(qs[1])
            cz(qs[0], qs[1])
    """)
    qubits = [T2.qubits[0], replace(T2.qubits[1], pulse_length_samples=32,
                                    pulse_sigma_samples=8.0)]
    c = mod.k.compile(CalibrationTable(qubits, T2.couplers), params=P2)
    assert ".envelope gauss0, gaussian, length=64, sigma=16.0, amp=1.0" in c.assembly
    assert ".envelope gauss1, gaussian, length=32, sigma=8.0, amp=1.0" in c.assembly
    assert _code(c)[:6] == ["play 0, gauss0, amp=1.000000000", "wait 64",
                            "play 1, gauss1, amp=1.000000000", "wait 32",
                            "play 2, gauss0, amp=1.0", "wait 64"]
    assert c.program.envelopes["gauss1"].addr == 64


# --- the math: pulses and frames against a state-vector reference -----------------------------

def _r(phi: float, theta: float) -> np.ndarray:
    """The simulated drive's rotation (QubitSystem): angle theta about (cos phi, sin phi, 0)."""
    n = math.cos(phi) * np.array([[0, 1], [1, 0]]) + math.sin(phi) * np.array([[0, -1j],
                                                                                [1j, 0]])
    return math.cos(theta / 2) * np.eye(2) - 1j * math.sin(theta / 2) * n


def _rz(theta: float) -> np.ndarray:
    return np.diag([np.exp(-0.5j * theta), np.exp(0.5j * theta)])


_GATE = {
    "x": np.array([[0, 1], [1, 0]]), "y": np.array([[0, -1j], [1j, 0]]),
    "z": np.diag([1, -1]), "h": np.array([[1, 1], [1, -1]]) / math.sqrt(2),
    "s": np.diag([1, 1j]), "t": np.diag([1, np.exp(0.25j * math.pi)]),
}


def _on(q: int, u: np.ndarray, n: int = 2) -> np.ndarray:
    """``u`` on qubit ``q`` of ``n`` (qubit q is bit q of the index, as QubitSystem's)."""
    out = np.eye(1)
    for k in reversed(range(n)):
        out = np.kron(out, u if k == q else np.eye(2))
    return out


_CZ = np.diag([1, 1, 1, -1])


def _reference(ops: list[tuple]) -> np.ndarray:
    psi = np.zeros(4, complex)
    psi[0] = 1
    for op in ops:
        name, *rest = op
        if name == "cz":
            psi = _CZ @ psi
        elif name in ("rx", "ry", "rz"):
            theta, q = rest
            axis = {"rx": 0.0, "ry": math.pi / 2}
            psi = _on(q, _rz(theta) if name == "rz" else _r(axis[name], theta)) @ psi
        else:
            psi = _on(rest[0], _GATE[name]) @ psi
    return psi


def _played(compiled, table: CalibrationTable) -> np.ndarray:
    """The state the program's pulses make, read from its assembly."""
    psi = np.zeros(4, complex)
    psi[0] = 1
    drive = {c.drive_channel: q for q, c in enumerate(table.qubits)}
    couplers = {c.channel for c in table.couplers}
    for line in _code(compiled):
        m = re.fullmatch(r"play (\d+), \w+, amp=([-\d.]+)(?:, phase=(\d+))?", line)
        if not m:
            continue
        ch, amp, phase = int(m[1]), float(m[2]), int(m[3] or 0)
        if ch in couplers:
            psi = _CZ @ psi
            continue
        q = drive[ch]
        theta = math.pi * amp / table.qubits[q].pi_amplitude
        psi = _on(q, _r(2 * math.pi * phase / 65536, theta)) @ psi
    return psi


def test_gate_sequences_give_the_reference_state_up_to_the_frames(load):
    rng = np.random.default_rng(7)
    names = ["x", "y", "z", "h", "s", "t", "rx", "ry", "rz", "cz"]
    for trial in range(12):
        ops, lines = [], []
        for _ in range(8):
            name = names[rng.integers(len(names))]
            q = int(rng.integers(2))
            if name == "cz":
                ops.append(("cz",))
                lines.append("cz(qs[0], qs[1])")
            elif name in ("rx", "ry", "rz"):
                theta = float(rng.uniform(-4, 4))
                ops.append((name, theta, q))
                lines.append(f"{name}({theta!r}, qs[{q}])")
            else:
                ops.append((name, q))
                lines.append(f"{name}(qs[{q}])")
        body = "\n    ".join(lines)
        mod, _ = load(f"@kernel\ndef k():\n    qs = qvector(2)\n    {body}\n")
        c = mod.k.compile(T2, params=P2)
        frame = np.kron(_rz(c.frames.get(1, 0.0)), _rz(c.frames.get(0, 0.0)))
        got = frame @ _played(c, T2)
        want = _reference(ops)
        assert abs(np.vdot(want, got)) == pytest.approx(1.0, abs=2e-4), (trial, lines)


def test_h_in_a_loop_or_an_arm_is_two_pulses_that_leave_the_frame(load):
    mod, _ = load("""
        @kernel
        def k():
            qs = qvector(2)
            h(qs[0])
            for _ in range(1):
                h(qs[1])
                rx(0.3, qs[0])
    """)
    c = mod.k.compile(T2, params=P2)
    plays = [i for i in _code(c) if i.startswith("play")]
    assert plays == ["play 0, gauss0, amp=0.500000000, phase=49152",
                     "play 1, gauss0, amp=0.500000000, phase=16384",
                     "play 1, gauss0, amp=1.000000000",
                     f"play 0, gauss0, amp={0.3 / math.pi:.9f}, phase=32768"]
    frame = np.kron(_rz(c.frames.get(1, 0.0)), _rz(c.frames.get(0, 0.0)))
    want = _reference([("h", 0), ("h", 1), ("rx", 0.3, 0)])
    assert abs(np.vdot(want, frame @ _played(c, T2))) == pytest.approx(1.0, abs=2e-4)


# --- classical control and timing --------------------------------------------------------------

def test_a_branch_on_a_fresh_measurement_waits_for_it_and_arms_take_equal_time(load):
    mod, _ = load("""
        @kernel
        def k():
            q = qubit()
            m = mz(q)
            if m:
                x(q)
            else:
                rx(0.5, q)
                rx(0.5, q)
            x(q)
    """)
    c = mod.k.compile(T1, params=P1)
    code = _code(c)
    assert code[:3] == ["acquire 0, r1, window=100, threshold=0", "wait 100", "beq r1, 0, L2"]
    # the arm's first pulse waits until the result has landed and the core is a lead ahead
    pad = int(code[3].split()[1])
    assert code[3].startswith("wait") and pad >= RESULT_LANDING_CYCLES + EVENT_LEAD_CYCLES
    text = c.assembly.splitlines()
    jump = next(i for i, line in enumerate(text) if line.strip().startswith("jmp"))
    other_label = code[2].split()[-1] + ":"
    end_label = text[jump].split()[-1] + ":"
    then = [line.strip() for line in text[text.index("        beq r1, 0, L2") + 1:jump]]
    other = [line.strip() for line in text[text.index(other_label) + 1:text.index(end_label)]]
    waits = [sum(int(i.split()[1]) for i in arm if i.startswith("wait")) for arm in (then, other)]
    assert waits[0] == waits[1]
    assert c.duration_cycles == 100 + waits[0] + 64


def test_if_not_and_comparisons_branch_on_the_false_case(load):
    mod, _ = load("""
        @kernel
        def k(n: int):
            q = qubit()
            m = mz(q)
            v = m + n
            if not m:
                x(q)
            if v >= 3:
                x(q)
            if 2 < v:
                x(q)
            if v <= n:
                x(q)
            if v != 1:
                x(q)
    """)
    code = _code(mod.k.compile(T1, 2, params=P1))
    branches = [i.rsplit(",", 1)[0] for i in code if i.split()[0] in ("beq", "bne", "blt",
                                                                      "bge")]
    assert branches == ["bne r1, 0", "blt r2, 3", "blt r2, 3", "bge r2, 3", "beq r2, 1"]
    assert "add r2, r1, 2" in code


def test_a_loop_with_a_conditional_reset_and_a_counter(load):
    mod, _ = load("""
        @kernel
        def k(n: int):
            q = qubit()
            count = 0
            for _ in range(n):
                h(q)
                m = mz(q)
                if m:
                    x(q)
                    count += 1
                s(q)                 # a whole turn of the frame: allowed in a loop
                s(q)
                z(q)
            return count, m
    """)
    c = mod.k.compile(T1, 5, params=P1)
    code = _code(c)
    assert code[:2] == ["set r1, 0", "set r2, 5"]
    assert code[-2:] == ["loop r2, L1", "end"]
    assert "L1:" in c.assembly and "add r1, r1, 1" in code
    assert c.results[0].register == 1 and c.results[1].register == 3 and c.returns_tuple
    assert c.result_value({"R1": 2, "R3": 1}) == (2, 1)
    assert c.duration_cycles is not None and c.duration_cycles % 5 == 0


def test_a_device_call_after_pulses_resyncs_past_them(load):
    mod, _ = load("""
        @kernel
        def k():
            q = qubit()
            m = mz(q)
            x(q)
            x(q)
            return device_call(adder, 1, 2)
    """)
    code = _code(mod.k.compile(T1, params=P1))
    # the core waits for the measurement, then the two pulses may still be queued: the SYNC
    # after the CALL leaves them room
    assert "add r0, r1, 0" in code
    sync = next(i for i in code if i.startswith("sync"))
    assert sync == f"sync {T1.cycles(T1.sync_slack_ns) + 128}"


def test_registers_arithmetic_uses_the_alu(load):
    mod, _ = load("""
        @kernel
        def k():
            a = qubit()
            b = qubit()
            m0 = mz(a)
            m1 = mz(b)
            syndrome = (m0 << 1) | m1
            parity = m0 ^ m1
            d = 5 - m0
            return syndrome, parity, d
    """)
    code = _code(mod.k.compile(T2, params=P2))
    assert "shl r3, r1, 1" in code and "or r4, r3, r2" in code and "xor r3, r1, r2" in code
    assert any(i.startswith("sub ") for i in code)


# --- errors name the kernel's source line ------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ("while True: pass", "While statements are not supported"),
    ("foo(q)", "`foo` is not a kernel operation"),
    ("y = undefined + 1", "unknown name 'undefined'"),
    ("m = mz(q); v = m * 3", "the PPU's ALU has no Mult"),
    ("m = mz(q); rx(m, q)", "a rotation angle is a constant or a kernel parameter"),
    ("cz(q, q)", "cz(a, b) of one qubit with itself"),
    ("p = qubit(); p2 = qubit()", "allocates 2 qubit(s); the calibration table has 1"),
    ("device_call(nohints, 1)", "needs the type hint int or bool"),
    ("device_call(adder, 1)", "adder takes 2 argument(s), 1 given"),
    ("for i in range(3): rx(i, q)", "the loop variable 'i' cannot be used"),
    ("for _ in range(3): s(q)", "the loop body turns qubit 0's frame"),
    ("m = mz(q)\nif m: s(q)", "leave qubit 0's frame at different phases"),
    ("q = qubit()", "'q' is already defined"),
    ("x(q, q)", "x() takes one qubit"),
    ("return 1\nx(q)", "`return` must be the kernel's last statement"),
    ("m = mz(q)\nif m: return m", "`return` must be the kernel's last statement"),
    ("a, b = 1, 2", "assign to one plain name"),
    ("v = x(q)", "x() is a gate; it has no value"),
    ("v = device_call(log, 1)", "log returns None; it has no value to assign"),
    ("m = mz(q)\nif m < 1.5: x(q)", "compare a register with an int"),
])
def test_unsupported_constructs_name_file_and_line(load, line, message):
    body = line.replace("\n", "\n            ")
    mod, path = load(f"""
        @kernel
        def k():
            q = qubit()
            {body}
    """)
    with pytest.raises(KernelCompileError) as info:
        mod.k.compile(T1, params=P1)
    text = str(info.value)
    assert message in text
    assert text.startswith(f"{path}:")
    assert info.value.lineno >= _line_of(path, "q = qubit()")


def test_the_error_line_is_the_offending_statements(load):
    mod, path = load("""
        @kernel
        def k():
            q = qubit()
            x(q)
            print(q)
    """)
    with pytest.raises(KernelCompileError, match=rf"^{re.escape(str(path))}:"
                                                 rf"{_line_of(path, 'print(q)')}: "):
        mod.k.compile(T1, params=P1)


def test_a_board_build_without_ncos_refuses_gates_that_need_a_phase(load):
    mod, path = load("""
        @kernel
        def k():
            q = qubit()
            x(q)
            h(q)
    """)
    board = QSCParams(nco=False)
    table = CalibrationTable.for_simulation(1, board)
    with pytest.raises(KernelCompileError, match=rf":{_line_of(path, 'h(q)')}: qubit 0: the "
                                                 r"build has no NCO \(nco = False\)"):
        mod.k.compile(table, params=board)
    mod2, _ = load("""
        @kernel
        def k():
            q = qubit()
            x(q)
            rx(-0.3, q)
            m = mz(q)
    """)
    assert "play 0, gauss0, amp=1.000000000" in _code(mod2.k.compile(table, params=board))


def test_arguments_are_checked_and_a_kernel_is_not_called(load):
    mod, _ = load("""
        @kernel
        def k(i: int):
            q = qubit()
    """)
    with pytest.raises(KernelCompileError, match="takes 1 argument"):
        mod.k.compile(T1, params=P1)
    with pytest.raises(KernelCompileError, match="a kernel parameter is an int or a float"):
        mod.k.compile(T1, "3", params=P1)
    with pytest.raises(KernelCompileError, match="runs on a QSC"):
        mod.k(1)
    with pytest.raises(KernelCompileError, match="used inside an @openqlink.kernel"):
        kernels.h(0)


def test_a_table_for_another_clock_is_refused(load):
    mod, _ = load("""
        @kernel
        def k():
            q = qubit()
    """)
    with pytest.raises(KernelCompileError, match="calibration table is for"):
        mod.k.compile(replace(T1, dtd_clk_hz=125_000_000), params=P1)


def test_kernel_decorates_functions_only():
    with pytest.raises(KernelCompileError, match="decorates a function"):
        kernel(42)
