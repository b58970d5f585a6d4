"""A Linux TAP interface as the simulated QSC's Ethernet port.

``qlink sim --tap NAME`` attaches the gateware's MAC to the TAP interface ``NAME``: the frames
the kernel sends out of the interface go into the simulated QSC's receive port, and the frames
the QSC sends are written to the interface, where the kernel receives them as from a NIC. The
kernel's own stack (``ping``, ARP) and any ``AF_PACKET`` program on the interface, such as the
host's raw bridge (:class:`openqlink.bridges.rawsock.RawSocketTransport`), then reach the
simulated QSC as they reach a board on a cable.

:class:`TapDevice` opens an interface that exists already (``ip tuntap add dev NAME mode tap``)
through ``/dev/net/tun`` with ``IFF_TAP | IFF_NO_PI``: each ``read`` is one whole Ethernet frame
(destination MAC first, no FCS, no packet-information header) and each ``write`` one frame. The
file descriptor is non-blocking. Opening it needs ``CAP_NET_ADMIN`` unless the interface was
made for this user (``ip tuntap add ... user NAME``).

# Ref: Linux Documentation/networking/tuntap.rst (TUNSETIFF, IFF_TAP, IFF_NO_PI);
# linux/if_tun.h; netdevice(7) (struct ifreq, SIOCGIFFLAGS).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct

from ..errors import QlinkError

__all__ = ["TapDevice", "TapError", "MIN_FRAME_BYTES", "check_tap", "pad_frame"]

_TUN_PATH = "/dev/net/tun"
#: linux/if_tun.h: _IOW('T', 202, int), and the flags of struct ifreq's ifr_flags.
_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
#: net/if.h: the interface is up, and running (carrier: a reader holds its TAP).
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_IFNAMSIZ = 16
#: struct ifreq: the name, then a union of 24 bytes whose first field is the short flags.
_IFREQ = struct.Struct("16sH22x")
_MAX_FRAME_BYTES = 65535
#: The shortest Ethernet frame without FCS: a NIC pads a shorter one with zeros to this length
#: before it goes on the wire (IEEE 802.3-2018 3.2.8).
MIN_FRAME_BYTES = 60


class TapError(QlinkError, OSError):
    """A TAP interface cannot be opened: the message says why in one line."""


def pad_frame(frame: bytes) -> bytes:
    """``frame`` as a NIC puts it on the wire: padded with zero bytes to
    :data:`MIN_FRAME_BYTES` (60) when shorter; longer frames unchanged."""
    return frame + bytes(MIN_FRAME_BYTES - len(frame)) if len(frame) < MIN_FRAME_BYTES else frame


def _explain(name: str, exc: OSError) -> str:
    if exc.errno == errno.EPERM:
        return (f"TAP {name}: opening it needs CAP_NET_ADMIN (run as root, or make the TAP "
                "for this user: ip tuntap add dev NAME mode tap user USER)")
    if exc.errno == errno.EINVAL:
        return f"TAP {name}: {name} is not a TAP interface (ip tuntap add dev {name} mode tap)"
    if exc.errno == errno.EBUSY:
        return f"TAP {name}: another program has it open"
    return f"TAP {name}: {exc.strerror or exc}"


class TapDevice:
    """The TAP interface ``name``, opened for reading and writing whole Ethernet frames.

    Parameters
    ----------
    name : str
        The interface's name (at most 15 bytes). It must exist in this process's network
        namespace; this class does not create it.

    Attributes
    ----------
    name : str
    frames_read, frames_written : int
        Frames taken from the kernel and handed to it.
    write_errors : int
        Frames the kernel refused (e.g. while the interface is down); they are lost, as on a
        cable that is unplugged.

    Raises :class:`TapError` (a one-line reason) when ``/dev/net/tun`` is missing, the name is
    too long, no interface of that name exists, it is no TAP, another program holds it, or
    opening it is not permitted.
    """

    def __init__(self, name: str):
        raw = name.encode()
        if not raw or len(raw) >= _IFNAMSIZ or "/" in name or name.strip() != name:
            raise TapError(f"TAP {name!r}: not an interface name (1 to {_IFNAMSIZ - 1} bytes)")
        try:
            socket.if_nametoindex(name)
        except OSError:
            raise TapError(f"TAP {name}: no interface of that name here; make it first (ip "
                           f"tuntap add dev {name} mode tap), in this network namespace") \
                from None
        try:
            fd = os.open(_TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise TapError(f"TAP {name}: {_TUN_PATH} is missing (modprobe tun)") from None
        except OSError as exc:
            raise TapError(f"TAP {name}: {_TUN_PATH}: {exc.strerror or exc}") from None
        try:
            fcntl.ioctl(fd, _TUNSETIFF, _IFREQ.pack(raw, _IFF_TAP | _IFF_NO_PI))
        except OSError as exc:
            os.close(fd)
            raise TapError(_explain(name, exc)) from None
        self.name = name
        self._fd: int | None = fd
        self.frames_read = 0
        self.frames_written = 0
        self.write_errors = 0

    def fileno(self) -> int:
        """The file descriptor (non-blocking; readable when the kernel has queued a frame).
        Raises :class:`ValueError` after :meth:`close`."""
        if self._fd is None:
            raise ValueError(f"TAP {self.name} is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._fd is None

    def read(self) -> bytes | None:
        """The next frame the kernel sent out of the interface (as the kernel built it: no
        FCS, a short frame not padded), or ``None`` when none is queued or the device is
        closed. Never waits."""
        if self._fd is None:
            return None
        try:
            frame = os.read(self._fd, _MAX_FRAME_BYTES)
        except BlockingIOError:
            return None
        self.frames_read += 1
        return frame

    def write(self, frame: bytes) -> bool:
        """Hand ``frame`` (Ethernet, no FCS) to the kernel as received on the interface.
        Returns False, and counts it in :attr:`write_errors`, when the kernel refuses it or
        the device is closed."""
        if self._fd is None:
            self.write_errors += 1
            return False
        try:
            os.write(self._fd, frame)
        except OSError:
            self.write_errors += 1
            return False
        self.frames_written += 1
        return True

    def is_up(self) -> bool:
        """Whether the interface is administratively up (``ip link set NAME up``)."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            reply = fcntl.ioctl(sock, _SIOCGIFFLAGS, _IFREQ.pack(self.name.encode(), 0))
        return bool(_IFREQ.unpack(reply)[1] & _IFF_UP)

    def close(self) -> None:
        """Let go of the interface (the kernel sees its carrier drop; a persistent TAP stays).
        Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> TapDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_tap(name: str) -> None:
    """Check that a run can attach to the TAP ``name`` here: it opens (:class:`TapDevice`),
    it is up, and a raw socket can be bound to it (the host's raw bridge needs
    ``CAP_NET_RAW``). Everything is closed again before this returns.

    Raises :class:`TapError` with a one-line reason otherwise."""
    from ..bridges.rawsock import RawSocketTransport

    with TapDevice(name) as tap:
        if not tap.is_up():
            raise TapError(f"TAP {name}: the interface is down (ip link set {name} up)")
        try:
            RawSocketTransport(name, rx_ring_frames=0).close()
        except PermissionError:
            raise TapError(f"TAP {name}: the host's raw bridge needs CAP_NET_RAW (run as "
                           "root)") from None
        except OSError as exc:
            raise TapError(f"TAP {name}: raw socket: {exc.strerror or exc}") from None
