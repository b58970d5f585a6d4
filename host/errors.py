"""Typed exceptions raised by the openqlink host package.

Every exception that reports bad input names the offending field, so a user can find the byte
that was wrong without a debugger.
"""

from __future__ import annotations

__all__ = [
    "QlinkError",
    "WireFormatError",
    "TruncatedError",
    "FieldRangeError",
    "AssemblerError",
    "ControlPlaneError",
    "ClaimedError",
    "PPUTimeoutError",
    "VersionMismatchError",
    "UploadError",
    "DispatchError",
    "GPUError",
    "GPUUnavailableError",
    "HostOrderError",
    "CompileError",
    "LinkError",
    "PlotError",
    "PlotUnavailableError",
]


class QlinkError(Exception):
    """Base class of every error raised by openqlink."""


class WireFormatError(QlinkError, ValueError):
    """A packet or header does not follow its wire format.

    Attributes
    ----------
    header : str
        Name of the header or message being decoded or encoded (``"BTH"``, ``"RPCHeader"``).
    field : str
        Name of the offending field, as the spec names it (``"magic"``, ``"dest_qp"``).
    value : object
        The offending value, or ``None`` when there is none (e.g. a truncated buffer).
    """

    def __init__(self, header: str, field: str, value: object, reason: str):
        self.header = header
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{header}.{field}: {reason}")


class TruncatedError(WireFormatError):
    """A buffer ends before the header or payload it must hold."""


class FieldRangeError(WireFormatError):
    """A value does not fit the width of the field it is packed into."""


class AssemblerError(QlinkError, ValueError):
    """A PPU assembly source is wrong; carries the file name, line number and the bad token."""

    def __init__(self, message: str, *, filename: str = "<asm>", line: int = 0, token: str = ""):
        self.filename = filename
        self.line = line
        self.token = token
        where = f"{filename}:{line}: " if line else f"{filename}: "
        super().__init__(f"{where}{message}")


class ControlPlaneError(QlinkError):
    """The QSC answered a control-plane request with a non-zero status, or did not answer.

    Attributes
    ----------
    status : int | None
        The control-plane status byte (``0x03`` bad address, ``0x04`` bad command, ...), or
        ``None`` for a time-out.
    addr : int
        The register address of the request.
    """

    def __init__(self, message: str, *, status: int | None, addr: int):
        self.status = status
        self.addr = addr
        super().__init__(message)


class PPUTimeoutError(ControlPlaneError):
    """The QSC answered status PPU_TIMEOUT (0x20, an openqlink extension of the control-bus set).

    The PPU side (``dtd`` clock domain) did not take or answer the register access within the
    gateware's bound (``PPU_TIMEOUT_CYCLES`` = 1024 ``rti`` cycles, 8.2 us at 125 MHz): its clock
    is stopped (a PLL not locked), it is held in reset, or the path to it stayed full. A write so
    answered was not executed; the network side of the QSC keeps working. ``status`` is 0x20.
    """


class ClaimedError(ControlPlaneError):
    """The QSC answered status CLAIMED (0x21, an openqlink extension of the control-bus set).

    Another host (another source MAC or IP) claimed the QSC's control plane: the write was not
    executed. Reads stay open: the global CLAIM register gives the owner's IPv4 address. The
    owner releases the QSC by writing 0 to CLAIM (:meth:`openqlink.qsc.QSC.release`); a reset of
    the QSC releases it too. ``status`` is 0x21.
    """


class UploadError(QlinkError):
    """An upload (instructions or envelope samples) did not land whole after its retries.

    UC does not retransmit: a lost RDMA WRITE (a bad ICRC, a full receive buffer) leaves the
    PPU's UPLOAD_WORDS count short of the words sent.

    Attributes
    ----------
    ppu : int
        The PPU.
    region : str
        ``"IMEM"`` or ``"ENV"``.
    words_sent, words_landed : int
        64-bit words sent by the last attempt, and counted by the PPU for it.
    attempts : int
        Attempts made.
    """

    def __init__(self, message: str, *, ppu: int, region: str, words_sent: int,
                 words_landed: int, attempts: int):
        self.ppu = ppu
        self.region = region
        self.words_sent = words_sent
        self.words_landed = words_landed
        self.attempts = attempts
        super().__init__(message)


class VersionMismatchError(QlinkError):
    """The QSC's version register names a gateware or ISA version this host does not speak."""


class DispatchError(QlinkError):
    """A function-table entry or a dispatcher configuration is wrong."""


class PlotError(QlinkError, ValueError):
    """A picture cannot be drawn from the input given (:mod:`openqlink.plot`).

    Attributes
    ----------
    field : str
        The offending input: ``"path"`` (an output suffix that is no picture format), a key of
        the results (``"events"``, ``"rpc"``, ``"params"``) or ``"ppu"``.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


class PlotUnavailableError(QlinkError, ImportError):
    """matplotlib, which draws the pictures, is not installed (the ``[plot]`` extra)."""


class GPUError(QlinkError):
    """The GPU data plane failed: a CUDA driver call, a kernel that does not stop, a bad setup."""


class GPUUnavailableError(GPUError):
    """No CUDA driver or no GPU: ``cuInit`` (or the device lookup) failed.

    Attributes
    ----------
    code : str
        The CUDA driver's error name (``"CUDA_ERROR_NO_DEVICE"``), or the import error.
    """

    def __init__(self, message: str, *, code: str = ""):
        self.code = code
        super().__init__(message)


class HostOrderError(GPUError):
    """The host CPU does not keep its stores in program order for other agents, which the GPU
    loopback ring relies on: the host writes a request's bytes, then its sequence word, with
    plain stores, and the GPU takes the word as the sign that the bytes are there. x86-64 (TSO)
    keeps that order; a weakly ordered CPU (aarch64, as on GH200 and GB200, or POWER, RISC-V)
    may make the word visible first, and the kernel would then answer stale bytes. Raised
    before any GPU work.

    Attributes
    ----------
    machine : str
        The machine the host reported (``platform.machine()``, e.g. ``"aarch64"``).
    """

    def __init__(self, machine: str):
        self.machine = machine
        super().__init__(
            f"the GPU loopback ring needs a host CPU that keeps stores in order (x86-64, TSO); "
            f"this host is {machine!r}, whose stores other agents (the GPU) may see out of "
            "order: a request's sequence word could arrive before its bytes. Not supported.")


class CompileError(GPUError):
    """NVRTC or numba-cuda could not compile a source to LTO-IR.

    Attributes
    ----------
    name : str
        The source's name (``"unified_dispatch.cu"``, the handler's name).
    log : str
        The compiler's log, as it printed it.
    """

    def __init__(self, name: str, log: str):
        self.name = name
        self.log = log
        super().__init__(f"{name}: compilation failed:\n{log}")


class LinkError(GPUError):
    """nvJitLink could not link the LTO-IR inputs into a cubin.

    Attributes
    ----------
    inputs : tuple[str, ...]
        The names of the linked inputs.
    log : str
        nvJitLink's error log (and info log), as it printed them.
    """

    def __init__(self, inputs: tuple[str, ...], log: str):
        self.inputs = inputs
        self.log = log
        super().__init__(f"nvJitLink failed linking {', '.join(inputs)}:\n{log}")
