"""DEVICE_CALL handlers: CUDA C++ source compiled by NVRTC, or Python compiled by numba-cuda.

Every handler ends up as an ``extern "C" __device__`` function of CUDA-Q's DeviceRPCFunction
type, linked as LTO-IR into the dispatch module::

    int handler(const void* in, void* out, uint32_t arg_len, uint32_t max_result_len,
                uint32_t* result_len);

``in`` holds ``arg_len`` argument bytes (the schema's arguments concatenated, no padding),
``out`` takes at most ``max_result_len`` result bytes, ``*result_len`` says how many were
written; the return value is the response status (0 ok, > 0 handler error).

* :class:`CudaHandler` -- the function in CUDA C++ (``#include "openqlink_dispatch.cuh"`` gives
  the fixed-width types and ``QLINK_STATUS_*``).
* :class:`NumbaHandler` -- a Python function taking the schema's arguments as values; numba-cuda
  compiles it with the C ABI and a generated CUDA C++ adapter (NVRTC) unpacks the arguments,
  calls it and packs its result. Argument types: UINT8/INT32/INT64/FLOAT32/FLOAT64 as the
  numba scalar; ARRAY_UINT8 and BIT_PACKED as ``CPointer(uint8)`` to the payload bytes;
  ARRAY_INT32/FLOAT32/FLOAT64 as ``CPointer`` of the element type to an aligned copy. Results:
  a schema with exactly one scalar result takes the function's return value (converted to the
  result type; status 0); any other schema passes one ``CPointer`` per result after the
  arguments (element type, BIT_PACKED as uint8 bytes) and the function returns an integer
  status, or nothing (status 0). A result that does not fit ``max_result_len`` gives status 1.

# Ref: cuda-quantum realtime/include/cudaq/realtime/cudaq_realtime.h (DeviceRPCFunction);
# realtime/docs/cudaq_realtime_message_protocol.md (payload types, schema); numba-cuda
# documentation "C ABI" (cuda.compile abi="c", abi_info abi_name)
"""

from __future__ import annotations

import hashlib
import inspect
import re
import types
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..dispatch import FunctionEntry, TypeDesc
from ..errors import CompileError, DispatchError
from ..wire.rpc import PayloadType
from .sources import headers
from .toolchain import LinkInput, cache_key, numba_compile, nvrtc_compile, toolchain_versions

__all__ = ["DeviceHandler", "CudaHandler", "NumbaHandler", "numba_handler", "HANDLER_SIGNATURE"]

#: The C signature every DEVICE_CALL handler has (``%s`` is the symbol).
HANDLER_SIGNATURE = ("int %s(const void* in, void* out, uint32_t arg_len, "
                     "uint32_t max_result_len, uint32_t* result_len)")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_symbol(symbol: str, what: str) -> str:
    if not _IDENT.fullmatch(symbol):
        raise DispatchError(f"{what}: {symbol!r} is not a C identifier; give the handler a "
                            "symbol= that is")
    return symbol


class DeviceHandler(ABC):
    """A DEVICE_CALL handler that compiles to LTO-IR.

    ``symbol`` is the ``extern "C"`` name of the handler function in the linked module; ``None``
    means the function-table entry's name (which must then be a C identifier).
    """

    symbol: str | None = None

    def resolve_symbol(self, name: str) -> str:
        """The handler's C symbol for the entry ``name``; raises :class:`DispatchError` when it is
        not a C identifier."""
        return _check_symbol(self.symbol or name, f"handler of {name!r}")

    @abstractmethod
    def key(self, entry: FunctionEntry, arch: str) -> str:
        """A cache key of everything :meth:`compile` depends on."""

    @abstractmethod
    def compile(self, entry: FunctionEntry, arch: str) -> list[LinkInput]:
        """The LTO-IR modules defining the handler for ``entry``; raises
        :class:`openqlink.errors.CompileError`."""


class CudaHandler(DeviceHandler):
    """A handler written in CUDA C++: ``source`` defines ``extern "C" __device__`` function
    ``symbol`` with :data:`HANDLER_SIGNATURE` (and anything else it needs).

    ``options`` are extra NVRTC options (``-D...``, ``-I`` is not available: NVRTC has no file
    system includes here; the packaged header is always available).
    """

    def __init__(self, source: str, symbol: str | None = None, *,
                 options: Sequence[str] = ()):
        self.source = source
        self.symbol = symbol
        self.options = tuple(options)
        if symbol is not None:
            _check_symbol(symbol, "CudaHandler symbol")

    def key(self, entry: FunctionEntry, arch: str) -> str:
        return cache_key("cuda-handler", self.source, self.resolve_symbol(entry.name),
                         *self.options, arch, toolchain_versions().key())

    def compile(self, entry: FunctionEntry, arch: str) -> list[LinkInput]:
        symbol = self.resolve_symbol(entry.name)
        name = f"handler_{symbol}.cu"
        return [LinkInput(name, nvrtc_compile(self.source, name, arch, headers=headers(),
                                              options=self.options))]

    def __repr__(self) -> str:
        return f"CudaHandler(symbol={self.symbol!r})"


# PayloadType -> (numba type name, C type) of scalars, and element types of arrays.
_SCALARS = {
    PayloadType.UINT8: ("uint8", "uint8_t"),
    PayloadType.INT32: ("int32", "int32_t"),
    PayloadType.INT64: ("int64", "int64_t"),
    PayloadType.FLOAT32: ("float32", "float"),
    PayloadType.FLOAT64: ("float64", "double"),
}
_ELEMENTS = {
    PayloadType.ARRAY_UINT8: ("uint8", "uint8_t"),
    PayloadType.ARRAY_INT32: ("int32", "int32_t"),
    PayloadType.ARRAY_FLOAT32: ("float32", "float"),
    PayloadType.ARRAY_FLOAT64: ("float64", "double"),
    PayloadType.BIT_PACKED: ("uint8", "uint8_t"),
}
# numba return type name -> C type (numba's C ABI returns the value; none as a null pointer).
_RETURNS = {
    "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "float32": "float", "float64": "double", "none": "void*",
}
_INTS = {k for k in _RETURNS if "int" in k}


def _numba_type(name: str, pointer: bool) -> Any:
    from numba import types
    t = getattr(types, name)
    return types.CPointer(t) if pointer else t


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code objects nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _value_fingerprint(value: Any, seen: set[int]) -> str:
    """What a handler may compile in from ``value`` (numba freezes globals, closure cells and
    defaults as constants): plain values by ``repr``, arrays by dtype, shape and a hash of their
    bytes, functions and numba dispatchers by their own fingerprint, modules by name. Anything
    else gets a fresh random part: such a handler is compiled again each time rather than
    served a stale cubin."""
    if value is None or isinstance(value, bool | int | float | complex | str | bytes):
        return repr(value)
    if isinstance(value, tuple | list):
        inner = ",".join(_value_fingerprint(v, seen) for v in value)
        return f"{type(value).__name__}({inner})"
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if isinstance(value, np.ndarray):
        return (f"ndarray:{value.dtype.str}:{value.shape}:"
                f"{hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()}")
    if isinstance(value, np.generic):
        return f"{value.dtype.str}:{value!r}"
    func = getattr(value, "py_func", value)     # a numba dispatcher's Python function
    if isinstance(func, types.FunctionType):
        if id(func) in seen:
            return f"recursive:{func.__qualname__}"
        return "fn:" + "|".join(_function_fingerprint(func, seen))
    return f"uncacheable:{type(value).__qualname__}:{uuid.uuid4().hex}"


def _function_fingerprint(func: Callable[..., Any], seen: set[int] | None = None) -> list[str]:
    """What a Python handler's compiled code depends on: its source, bytecode and constants (its
    nested code objects' too), its default arguments, the values in its closure cells, and the
    value of every global it names, functions it calls included (see
    :func:`_value_fingerprint`)."""
    seen = set() if seen is None else seen
    seen.add(id(func))
    code = func.__code__
    parts = [func.__qualname__]
    for c in _code_objects(code):
        parts += [c.co_code.hex(), repr([k for k in c.co_consts
                                         if not isinstance(k, types.CodeType)])]
    try:
        parts.append(inspect.getsource(func))
    except (OSError, TypeError):
        parts.append("<no source>")
    parts.append("defaults=" + _value_fingerprint(func.__defaults__, seen))
    kwdefaults = sorted((func.__kwdefaults__ or {}).items())
    parts.append("kwdefaults=" + _value_fingerprint(kwdefaults, seen))
    for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=True):
        try:
            parts.append(f"cell {name}={_value_fingerprint(cell.cell_contents, seen)}")
        except ValueError:     # an empty cell
            parts.append(f"cell {name} empty")
    glb = getattr(func, "__globals__", {})
    names = sorted({n for c in _code_objects(code) for n in c.co_names})
    for name in names:
        if name in glb:
            parts.append(f"{name}={_value_fingerprint(glb[name], seen)}")
    return parts


class NumbaHandler(DeviceHandler):
    """A handler written in Python, compiled by numba-cuda; see the module docstring for how the
    schema's arguments and results map onto the function's parameters and return value.

    The cache key covers the function's source, bytecode and constants, its default arguments,
    its closure cells and the globals it names (arrays by content, the functions it calls by
    their own code, values it cannot fingerprint by a fresh random part: those compile again
    each time).
    """

    def __init__(self, func: Callable[..., Any], symbol: str | None = None):
        if not callable(func):
            raise DispatchError(f"NumbaHandler needs a Python function, not {func!r}")
        self.func = func
        self.symbol = symbol
        if symbol is not None:
            _check_symbol(symbol, "NumbaHandler symbol")

    def key(self, entry: FunctionEntry, arch: str) -> str:
        return cache_key("numba-handler", *_function_fingerprint(self.func),
                         self.resolve_symbol(entry.name), entry.schema_bytes(), arch,
                         toolchain_versions().key())

    @staticmethod
    def _returns_value(entry: FunctionEntry) -> bool:
        return len(entry.results) == 1 and entry.results[0].type_id in _SCALARS

    def signature(self, entry: FunctionEntry) -> list[Any]:
        """The numba argument types the function is compiled for."""
        sig = []
        for d in entry.args:
            if d.type_id in _SCALARS:
                sig.append(_numba_type(_SCALARS[d.type_id][0], False))
            else:
                sig.append(_numba_type(_ELEMENTS[d.type_id][0], True))
        if not self._returns_value(entry):
            for d in entry.results:
                table = _SCALARS if d.type_id in _SCALARS else _ELEMENTS
                sig.append(_numba_type(table[d.type_id][0], True))
        return sig

    def compile(self, entry: FunctionEntry, arch: str) -> list[LinkInput]:
        symbol = self.resolve_symbol(entry.name)
        impl = f"qlink_numba_{symbol}"
        ltoir, resty = numba_compile(self.func, self.signature(entry), impl, arch)
        ret = str(resty)
        if ret not in _RETURNS:
            raise CompileError(impl, f"numba handler {entry.name!r} returns {ret}; return an "
                                     "integer or float (or nothing)")
        if self._returns_value(entry) and ret == "none":
            raise CompileError(impl, f"numba handler {entry.name!r} returns nothing, but the "
                                     "schema has one scalar result: return it")
        if not self._returns_value(entry) and ret not in _INTS and ret != "none":
            raise CompileError(impl, f"numba handler {entry.name!r} returns {ret}; with result "
                                     "pointers it returns an integer status or nothing")
        adapter = numba_adapter_source(entry, symbol, impl, _RETURNS[ret])
        name = f"numba_adapter_{symbol}.cu"
        return [LinkInput(f"numba_{symbol}.ltoir", ltoir),
                LinkInput(name, nvrtc_compile(adapter, name, arch, headers=headers()))]

    def __repr__(self) -> str:
        return f"NumbaHandler({getattr(self.func, '__qualname__', self.func)!r})"


def numba_handler(func: Callable[..., Any] | None = None, *,
                  symbol: str | None = None) -> Any:
    """Decorator: ``@numba_handler`` (or ``@numba_handler(symbol="x")``) makes a Python function
    a :class:`NumbaHandler`, usable as a DEVICE_CALL entry's handler."""
    if func is None:
        return lambda f: NumbaHandler(f, symbol)
    return NumbaHandler(func, symbol)


def _c_type(d: TypeDesc) -> str:
    return (_SCALARS.get(d.type_id) or _ELEMENTS[d.type_id])[1]


def numba_adapter_source(entry: FunctionEntry, symbol: str, impl: str, impl_return: str) -> str:
    """CUDA C++ of the adapter ``symbol`` (the DEVICE_CALL handler) that unpacks ``entry``'s
    arguments, calls the numba function ``impl`` (C ABI, returning ``impl_return``) and packs
    its results."""
    returns_value = NumbaHandler._returns_value(entry)
    params, decls, body = [], [], []
    off = 0
    for i, d in enumerate(entry.args):
        ct = _c_type(d)
        if d.type_id in _SCALARS:
            params.append(ct)
            body.append(f"    {ct} a{i}; memcpy(&a{i}, p + {off}, sizeof(a{i}));")
            decls.append(f"a{i}")
        elif ct == "uint8_t":
            params.append("uint8_t*")
            decls.append(f"const_cast<uint8_t*>(p + {off})")
        else:
            params.append(f"{ct}*")
            n = d.num_elements
            body.append(f"    {ct} a{i}[{n}]; memcpy(a{i}, p + {off}, {d.size_bytes});")
            decls.append(f"a{i}")
        off += d.size_bytes
    out_bytes = entry.result_len_bytes
    post = []
    if returns_value:
        rt = _c_type(entry.results[0])
        call = f"    const {impl_return} ret = {impl}({', '.join(decls)});"
        post.append(f"    const {rt} r0 = static_cast<{rt}>(ret);")
        post.append("    memcpy(o, &r0, sizeof(r0));")
        post.append(f"    *result_len = {out_bytes}u;")
        post.append("    return QLINK_STATUS_OK;")
    else:
        roff = 0
        for j, d in enumerate(entry.results):
            ct = _c_type(d)
            params.append(f"{ct}*")
            n = d.num_elements if d.type_id not in _SCALARS else 1
            if d.type_id == PayloadType.BIT_PACKED:
                n = d.size_bytes
            body.append(f"    {ct} r{j}[{n}] = {{}};")
            decls.append(f"r{j}")
            post.append(f"    memcpy(o + {roff}, r{j}, {d.size_bytes});")
            roff += d.size_bytes
        call = f"    const {impl_return} ret = {impl}({', '.join(decls)});"
        if impl_return == "void*":
            status = "    const int status = QLINK_STATUS_OK; (void)ret;"
        else:
            status = "    const int status = static_cast<int>(ret);"
        post = [status,
                "    if (status != QLINK_STATUS_OK) { *result_len = 0; return status; }",
                *post,
                f"    *result_len = {out_bytes}u;",
                "    return QLINK_STATUS_OK;"]
    lines = [
        f"// Generated by openqlink.gpu: DEVICE_CALL adapter of the numba handler {entry.name!r}.",
        '#include "openqlink_dispatch.cuh"',
        f'extern "C" __device__ {impl_return} {impl}({", ".join(params)});',
        f'extern "C" __device__ {HANDLER_SIGNATURE % symbol} {{',
        "    const uint8_t* p = static_cast<const uint8_t*>(in);",
        "    uint8_t* o = static_cast<uint8_t*>(out);",
        "    (void)p; (void)o;",
        f"    if (arg_len != {entry.arg_len_bytes}u) {{ *result_len = 0; "
        "return QLINK_STATUS_BAD_ARG_LEN; }",
        f"    if (max_result_len < {out_bytes}u) {{ *result_len = 0; "
        "return QLINK_STATUS_HANDLER_ERROR; }",
        *body,
        call,
        *post,
        "}",
        "",
    ]
    return "\n".join(lines)
