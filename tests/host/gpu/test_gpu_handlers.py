"""numba handler adapters: the schema mapping, the generated source, refused return types."""

from __future__ import annotations

import pytest
from gpumodel import P, popcount8, sum4

from openqlink.dispatch import DispatchMode, FunctionEntry, TypeDesc
from openqlink.errors import CompileError, DispatchError
from openqlink.gpu import CudaHandler, DispatchProgram, NumbaHandler, cubin_symbols, numba_handler
from openqlink.gpu.handlers import numba_adapter_source

ARCH = "sm_90"


def entry(args, results, handler) -> FunctionEntry:
    return FunctionEntry("h", DispatchMode.DEVICE_CALL, tuple(args), tuple(results), handler)


def test_signature_maps_the_schema():
    from numba import types
    h = NumbaHandler(sum4)
    e = entry((TypeDesc.array(P.ARRAY_INT32, 4),), (P.INT32, P.UINT8), h)
    assert h.signature(e) == [types.CPointer(types.int32), types.CPointer(types.int32),
                              types.CPointer(types.uint8)]
    e2 = entry((P.UINT8, P.FLOAT64, TypeDesc.bits(12)), (P.FLOAT32,), h)
    assert h.signature(e2) == [types.uint8, types.float64, types.CPointer(types.uint8)]


def test_adapter_source_unpacks_at_payload_offsets():
    e = entry((P.UINT8, P.INT32, TypeDesc.array(P.ARRAY_FLOAT64, 2)), (P.INT64,),
              NumbaHandler(popcount8))
    src = numba_adapter_source(e, "h", "qlink_numba_h", "int64_t")
    assert "uint8_t a0; memcpy(&a0, p + 0, sizeof(a0));" in src
    assert "int32_t a1; memcpy(&a1, p + 1, sizeof(a1));" in src
    assert "double a2[2]; memcpy(a2, p + 5, 16);" in src
    assert "if (arg_len != 21u)" in src and "max_result_len < 8u" in src
    assert "const int64_t r0 = static_cast<int64_t>(ret);" in src


def test_numba_handlers_compile_with_their_adapter_and_link():
    """Each handler gives its numba LTO-IR and its adapter's, and the two link into a dispatch
    program whose function table points at the adapter (run on the GPU by test_gpu_launch)."""
    for fn, args, results in ((popcount8, (TypeDesc.bits(8),), (P.UINT8,)),
                              (sum4, (TypeDesc.array(P.ARRAY_INT32, 4),), (P.INT32, P.UINT8))):
        e = entry(args, results, NumbaHandler(fn))
        inputs = e.handler.compile(e, ARCH)
        assert [i.name for i in inputs] == ["numba_h.ltoir", "numba_adapter_h.cu"]
        assert all(len(i.ltoir) > 64 for i in inputs)
        prog = DispatchProgram(ARCH, cache=False)
        prog.add(e)
        linked = prog.link()
        assert linked.cubin[:4] == b"\x7fELF"
        assert linked.fnptr_symbols["h"] in cubin_symbols(linked.cubin)


def test_numba_return_types_refused():
    def returns_bool(a):
        return a > 3

    def returns_nothing(a):
        pass

    with pytest.raises(CompileError, match="returns bool"):
        NumbaHandler(returns_bool).compile(entry((P.INT32,), (P.INT32,), None), ARCH)
    with pytest.raises(CompileError, match="returns nothing"):
        NumbaHandler(returns_nothing).compile(entry((P.INT32,), (P.INT32,), None), ARCH)

    def float_status(a, out, out2):
        out[0] = a
        out2[0] = a
        return 1.5

    with pytest.raises(CompileError, match="integer status"):
        NumbaHandler(float_status).compile(entry((P.INT32,), (P.INT32, P.INT32), None), ARCH)


def test_decorator_and_symbols():
    @numba_handler(symbol="pc")
    def pc(bits):
        return bits[0]

    assert isinstance(pc, NumbaHandler) and pc.resolve_symbol("any name") == "pc"
    assert isinstance(numba_handler(sum4), NumbaHandler)
    with pytest.raises(DispatchError, match="not a C identifier"):
        CudaHandler("", symbol="1x")
    with pytest.raises(DispatchError, match="not a C identifier"):
        NumbaHandler(sum4, symbol="a-b")
    with pytest.raises(DispatchError, match="Python function"):
        NumbaHandler(42)  # type: ignore[arg-type]


def test_numba_cache_key_follows_code_and_globals():
    e = entry((TypeDesc.bits(8),), (P.UINT8,), None)

    def f(bits):
        return bits[0] + 1

    def g(bits):
        return bits[0] + 2

    assert NumbaHandler(f).key(e, ARCH) != NumbaHandler(g).key(e, ARCH)
    assert NumbaHandler(f).key(e, ARCH) == NumbaHandler(f).key(e, ARCH)
    assert NumbaHandler(f).key(e, ARCH) != NumbaHandler(f).key(e, "sm_80")
