"""NVRTC, numba-cuda and nvJitLink without a GPU: LTO-IR, the sm_90 link, errors, the cache."""

from __future__ import annotations

import dataclasses

import pytest
from gpumodel import ADD_SRC, P, device_entries, mul

from openqlink.dispatch import DispatchMode, FunctionEntry
from openqlink.errors import CompileError, DispatchError, GPUError, LinkError
from openqlink.gpu import (
    BUILTIN_KERNEL_ENTRY,
    CudaHandler,
    DispatchKernel,
    DispatchProgram,
    LinkCache,
    NumbaHandler,
    cubin_symbols,
    nvrtc_compile,
    toolchain_versions,
)
from openqlink.gpu import program as program_mod
from openqlink.gpu.sources import headers, read_source
from openqlink.gpu.toolchain import numba_compile, nvjitlink_link, parse_arch
from openqlink.wire.rpc import fnv1a32

ARCH = "sm_90"


def test_versions_are_cuda_13_0():
    v = toolchain_versions()
    assert v.nvrtc == (13, 0) and v.nvjitlink == (13, 0), v
    assert v.numba_cuda is not None and v.nvvm is not None


def test_nvrtc_compiles_kernel_and_bridge_to_ltoir():
    for name in ("unified_dispatch.cu", "loopback_bridge.cu"):
        ltoir = nvrtc_compile(read_source(name), name, ARCH, headers=headers())
        assert len(ltoir) > 100
    handler = nvrtc_compile(ADD_SRC, "add.cu", ARCH, headers=headers())
    assert len(handler) > 100


def test_nvrtc_error_carries_the_log():
    with pytest.raises(CompileError) as info:
        nvrtc_compile('extern "C" __device__ int f() { return no_such_thing; }', "bad.cu", ARCH)
    assert info.value.name == "bad.cu"
    assert "no_such_thing" in info.value.log and "error" in info.value.log


def test_numba_compiles_python_to_ltoir():
    from numba import types
    ltoir, resty = numba_compile(mul, (types.int32, types.int64), "qlink_test_mul", ARCH)
    assert len(ltoir) > 100 and str(resty) == "int64"
    with pytest.raises(CompileError, match="qlink_test_bad"):
        numba_compile(lambda a: a.no_attribute, (types.int32,), "qlink_test_bad", ARCH)


def test_link_everything_for_sm90():
    prog = DispatchProgram(ARCH, cache=False)
    for e in device_entries():
        prog.add(e)
    linked = prog.link()
    assert linked.cubin[:4] == b"\x7fELF" and not linked.from_cache
    syms = cubin_symbols(linked.cubin)
    assert BUILTIN_KERNEL_ENTRY in syms
    for e in device_entries():
        assert linked.fnptr_symbols[e.name] == f"qlink_fnptr_{e.name}"
        assert f"qlink_fnptr_{e.name}" in syms
    assert prog.link() is linked  # linked once


def test_inline_handlers_link_with_direct_calls():
    prog = DispatchProgram(ARCH, cache=False, inline_handlers=True)
    prog.add(device_entries()[0])
    prog.add(device_entries()[4])
    src = prog.call_source()
    assert "switch (function_id)" in src and "return add_i32(in, out" in src
    # Custom kernels call through the entry: the same switch, on the entry's function_id.
    assert "return qlink_call_handler_id(e->function_id, e," in src
    assert BUILTIN_KERNEL_ENTRY in prog.link().symbols


def test_two_handlers_with_one_function_id_are_refused():
    # The kernel's lookup takes the first entry of a function_id and the generated call unit
    # switches on it: two handlers behind one id cannot both be reached.
    assert fnv1a32("h84337") == fnv1a32("h1340180")
    prog = DispatchProgram(ARCH, cache=False, inline_handlers=True)
    prog.add(FunctionEntry("h84337", DispatchMode.DEVICE_CALL, (), (), CudaHandler(ADD_SRC,
                                                                                   "add_i32")))
    with pytest.raises(DispatchError, match="'h84337' and 'h1340180' share the function_id "
                                            "0x0a793622"):
        prog.add(FunctionEntry("h1340180", DispatchMode.DEVICE_CALL, (), (),
                               CudaHandler(ADD_SRC, "add_i32_other")))


def test_link_error_carries_nvjitlink_log():
    prog = DispatchProgram(ARCH, cache=False)
    # The source defines another symbol than the entry's: the handler is undefined at link.
    prog.add(FunctionEntry("lost", DispatchMode.DEVICE_CALL, (), (),
                           CudaHandler('#include "openqlink_dispatch.cuh"\n'
                                       'extern "C" __device__ int found(const void*, void*, '
                                       "uint32_t, uint32_t, uint32_t*) { return 0; }\n")))
    with pytest.raises(LinkError) as info:
        prog.link()
    assert "lost" in info.value.log
    assert "handler_lost.cu" in info.value.inputs
    assert "nvJitLink failed" in str(info.value)


def test_ltoir_for_another_arch_does_not_link():
    ltoir = nvrtc_compile(ADD_SRC, "add.cu", "sm_90", headers=headers())
    from openqlink.gpu import LinkInput
    with pytest.raises(LinkError):
        nvjitlink_link([LinkInput("add.cu", ltoir)], "sm_80")


def test_custom_kernel_links():
    src = read_source("unified_dispatch.cu").replace("qlink_unified_dispatch", "my_dispatch")
    prog = DispatchProgram(ARCH, cache=False, kernel=DispatchKernel(src, "my_dispatch"))
    prog.add(device_entries()[0])
    assert "my_dispatch" in prog.link().symbols
    bad = DispatchProgram(ARCH, cache=False, kernel=DispatchKernel(src, "not_there"))
    bad.add(device_entries()[0])
    with pytest.raises(LinkError, match="not_there"):
        bad.link()


def _program(arch: str = ARCH, src: str = ADD_SRC, cache=False) -> DispatchProgram:
    prog = DispatchProgram(arch, cache=cache)
    prog.add(FunctionEntry("add_i32", DispatchMode.DEVICE_CALL, (P.INT32, P.INT32), (P.INT32,),
                           CudaHandler(src)))
    prog.add(FunctionEntry("mul", DispatchMode.DEVICE_CALL, (P.INT32, P.INT64), (P.INT64,),
                           NumbaHandler(mul)))
    return prog


def test_cache_key_changes_with_versions_arch_and_sources(monkeypatch):
    base = _program().key()
    assert _program().key() == base
    assert _program("sm_80").key() != base
    assert _program(src=ADD_SRC + "\n// changed\n").key() != base
    real = toolchain_versions()
    for field in ("nvrtc", "nvjitlink", "numba_cuda", "nvvm"):
        other = dataclasses.replace(real, **{field: (99, 9) if field != "numba_cuda" else "9.9"})
        monkeypatch.setattr(program_mod, "toolchain_versions", lambda o=other: o)
        from openqlink.gpu import handlers as handlers_mod
        monkeypatch.setattr(handlers_mod, "toolchain_versions", lambda o=other: o)
        assert _program().key() != base, field
        monkeypatch.undo()
    assert _program().key() == base


def test_cache_memory_and_disk(tmp_path):
    cache = LinkCache(tmp_path)
    first = _program(cache=cache).link()
    assert not first.from_cache and cache.misses == 1
    again = _program(cache=cache).link()
    assert again.from_cache and again.cubin == first.cubin and cache.hits == 1
    fresh = LinkCache(tmp_path)  # another process: the disk copy
    assert _program(cache=fresh).link().from_cache
    assert list(tmp_path.glob("*.cubin")) == [tmp_path / f"{first.key}.cubin"]


def test_program_refuses_bad_entries():
    prog = DispatchProgram(ARCH, cache=False)
    with pytest.raises(DispatchError, match="not DEVICE_CALL"):
        prog.add(FunctionEntry("h", DispatchMode.HOST_CALL, handler=lambda: None))
    with pytest.raises(DispatchError, match="not a CudaHandler"):
        prog.add(FunctionEntry("d", DispatchMode.DEVICE_CALL, handler=0x1234))
    with pytest.raises(DispatchError, match="not a C identifier"):
        prog.add(FunctionEntry("a.b", DispatchMode.DEVICE_CALL, handler=CudaHandler(ADD_SRC)))
    prog.add(FunctionEntry("a.b", DispatchMode.DEVICE_CALL, handler=CudaHandler(ADD_SRC, "x")))
    with pytest.raises(DispatchError, match="share the C symbol"):
        prog.add(FunctionEntry("c", DispatchMode.DEVICE_CALL, handler=CudaHandler(ADD_SRC, "x")))
    with pytest.raises(DispatchError, match="already"):
        prog.add(FunctionEntry("a.b", DispatchMode.DEVICE_CALL, handler=CudaHandler(ADD_SRC, "y")))


def test_no_handler_added_after_link():
    prog = _program()
    prog.link()
    with pytest.raises(DispatchError, match="already linked"):
        prog.add(FunctionEntry("late", DispatchMode.DEVICE_CALL, handler=CudaHandler(ADD_SRC)))


def test_arch_and_cubin_checks():
    assert parse_arch("sm_90") == (9, 0) and parse_arch("sm_100a") == (10, 0)
    assert parse_arch("sm_120") == (12, 0)
    for bad in ("90", "sm90", "compute_90", "sm_9"):
        with pytest.raises(GPUError, match="sm_XY"):
            parse_arch(bad)
    with pytest.raises(GPUError, match="ELF"):
        cubin_symbols(b"not an elf")


def test_inline_handlers_refuse_an_address_of_another_program_handler():
    # The inlined switch calls the program's handler of a function_id: a table entry of that
    # function_id with another handler's address would run differently through the pointer.
    # Checked before any GPU work, so the loaded module is stood in for here.
    from openqlink.gpu import GPUDataPlane

    entries = {e.name: e for e in device_entries()}
    for inline in (True, False):
        plane = GPUDataPlane(4, 64, arch=ARCH, cache=False, inline_handlers=inline)
        plane.add(entries["add_i32"])
        plane.add(entries["fail7"])
        plane._module = object()  # as after get_device_handler(): addresses known
        plane._addresses = {"add_i32": 0x1000, "fail7": 0x2000}
        own = dataclasses.replace(entries["add_i32"], handler=0x1000)
        other = dataclasses.replace(entries["add_i32"], handler=0x2000)
        alias = FunctionEntry("alias", DispatchMode.DEVICE_CALL, (P.INT32, P.INT32), (P.INT32,),
                              0x2000)  # no program handler of this function_id: pointer call
        assert [a for _, a in plane._resolve([own, alias])] == [0x1000, 0x2000]
        if inline:
            with pytest.raises(DispatchError, match="inline_handlers=True"):
                plane.start([other])
        else:
            assert [a for _, a in plane._resolve([other])] == [0x2000]
