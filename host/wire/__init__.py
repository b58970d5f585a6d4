"""Wire formats, each defined once and used by the host codecs and the gateware alike.

:mod:`~openqlink.wire.header` (the one place of network byte order), then one module per
protocol: :mod:`~openqlink.wire.ethernet`, :mod:`~openqlink.wire.ipv4`, :mod:`~openqlink.wire.udp`,
:mod:`~openqlink.wire.roce` (BTH, RETH, ImmDt, opcodes, ICRC), :mod:`~openqlink.wire.control`
(the control plane), :mod:`~openqlink.wire.rpc` (CUDA-Q realtime's RPC messages), and
:mod:`~openqlink.wire.packet` (whole frames). See ``docs/wire_formats.md``.
"""

__all__: list[str] = []
