"""CUDA toolchain from Python: NVRTC and numba-cuda to LTO-IR, nvJitLink to a cubin, a link cache.

Every piece of device code (the dispatch kernel, the bridge's transport hooks, the handlers) is
compiled to LTO-IR for one architecture and linked by nvJitLink with ``-lto`` into one cubin.
Compile where you link: LTO-IR written by a newer NVRTC or NVVM cannot be read by an older
nvJitLink, so :func:`toolchain_versions` goes into every cache key, with the architecture.

* :func:`nvrtc_compile` -- CUDA C++ source (plus named headers) to LTO-IR with NVRTC
  (``cuda.core.Program``: ``-arch=sm_XY -dlto -rdc=true``); raises
  :class:`openqlink.errors.CompileError` with NVRTC's log.
* :func:`numba_compile` -- a Python function to LTO-IR with numba-cuda (``abi="c"``, the C name
  given by ``abi_name``); raises :class:`~openqlink.errors.CompileError`.
* :func:`nvjitlink_link` -- LTO-IR inputs to one cubin (``cuda.core.Linker`` on nvJitLink);
  raises :class:`openqlink.errors.LinkError` carrying nvJitLink's log.
* :class:`LinkCache` -- cubins by key, in memory and on disk (``$OPENQLINK_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/openqlink/gpu``, else ``~/.cache/openqlink/gpu``).
* :func:`cubin_symbols` -- the symbols a cubin defines (ELF symbol table), to check a link.

None of this needs a GPU or a driver: only the ``[gpu]`` extra's packages.

# Ref: NVRTC User Guide (nvrtcCompileProgram options -dlto, -rdc, nvrtcGetLTOIR); nvJitLink
# User Guide (nvJitLinkCreate -lto -arch, nvJitLinkGetErrorLog); numba-cuda "Compiling Python
# functions for use with other languages" (cuda.compile, abi="c", output="ltoir")
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import struct
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CompileError, GPUError, LinkError

__all__ = [
    "ToolchainVersions",
    "LinkInput",
    "LinkCache",
    "parse_arch",
    "toolchain_versions",
    "nvrtc_compile",
    "numba_compile",
    "nvjitlink_link",
    "cubin_symbols",
    "cache_key",
    "default_cache",
    "default_cache_dir",
]

log = logging.getLogger(__name__)

_ARCH = re.compile(r"sm_(\d)(\d+)([af]?)")


def parse_arch(arch: str) -> tuple[int, int]:
    """The compute capability ``(major, minor)`` of ``"sm_XY"`` (``"sm_90"`` -> ``(9, 0)``,
    ``"sm_100a"`` -> ``(10, 0)``). Raises :class:`GPUError` for anything else."""
    m = _ARCH.fullmatch(arch)
    if m is None:
        raise GPUError(f"arch {arch!r} is not of the form sm_XY (e.g. sm_90)")
    digits = m.group(1) + m.group(2)
    return int(digits[:-1]), int(digits[-1])


@dataclass(frozen=True)
class ToolchainVersions:
    """Versions that decide what LTO-IR can be linked: NVRTC's, nvJitLink's and numba-cuda's
    (with its NVVM), each ``None`` when the package is missing."""

    nvrtc: tuple[int, ...] | None
    nvjitlink: tuple[int, ...] | None
    numba_cuda: str | None
    nvvm: tuple[int, ...] | None

    def key(self) -> str:
        return f"nvrtc={self.nvrtc};nvjitlink={self.nvjitlink};numba_cuda={self.numba_cuda};" \
               f"nvvm={self.nvvm}"


@functools.cache
def toolchain_versions() -> ToolchainVersions:
    """The installed toolchain's versions (cached for the process)."""
    nvrtc_v: tuple[int, ...] | None = None
    nvjit_v: tuple[int, ...] | None = None
    nvvm_v: tuple[int, ...] | None = None
    numba_v: str | None = None
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
        if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            nvrtc_v = (major, minor)
    except Exception as exc:  # missing package or library: reported as None
        log.debug("NVRTC unavailable: %s", exc)
    try:
        from cuda.bindings import nvjitlink
        nvjit_v = tuple(nvjitlink.version())
    except Exception as exc:
        log.debug("nvJitLink unavailable: %s", exc)
    try:
        import numba_cuda
        numba_v = str(numba_cuda.__version__)
        from cuda.bindings import nvvm
        nvvm_v = tuple(nvvm.version()) + tuple(nvvm.ir_version())
    except Exception as exc:
        log.debug("numba-cuda/NVVM unavailable: %s", exc)
    return ToolchainVersions(nvrtc_v, nvjit_v, numba_v, nvvm_v)


def cache_key(*parts: str | bytes) -> str:
    """SHA-256 (hex) of the parts, each length-prefixed so that no two part lists collide."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else bytes(p)
        h.update(struct.pack("<Q", len(b)))
        h.update(b)
    return h.hexdigest()


@dataclass(frozen=True)
class LinkInput:
    """One LTO-IR module for nvJitLink: a name (for logs) and its bytes."""

    name: str
    ltoir: bytes


def _core() -> Any:
    """``cuda.core`` (the ``[gpu]`` extra), or :class:`GPUError` naming what is missing."""
    try:
        import cuda.core as core
    except ImportError as exc:
        raise GPUError(f"cuda.core is not installed (pip install 'openqlink[gpu]'): {exc}") \
            from None
    return core


def _macros(name: str, options: Sequence[str]) -> list[str | tuple[str, str]]:
    """``-DNAME`` / ``-DNAME=VALUE`` options as cuda.core's ``define_macro`` entries; any other
    option is a :class:`CompileError` naming it."""
    macros: list[str | tuple[str, str]] = []
    for option in options:
        if not option.startswith("-D") or len(option) == 2:
            raise CompileError(name, f"unsupported NVRTC option {option!r} (only -DNAME[=VALUE])")
        macro, eq, value = option[2:].partition("=")
        macros.append((macro, value) if eq else macro)
    return macros


def nvrtc_compile(source: str, name: str, arch: str, *,
                  headers: Mapping[str, str] | None = None,
                  options: Sequence[str] = ()) -> bytes:
    """Compile CUDA C++ ``source`` to LTO-IR for ``arch`` (``"sm_90"``) with NVRTC, through
    ``cuda.core.Program``.

    ``headers`` maps include names to their text (``#include "name"`` finds them: they are
    written into a private include directory for the compilation); ``options`` are macro
    definitions ``-DNAME[=VALUE]``. The compilation is NVRTC's ``-arch=<arch> -dlto -rdc=true
    -default-device -std=c++17``. Raises :class:`CompileError` carrying NVRTC's log (also for
    an option other than ``-D``), :class:`GPUError` when NVRTC or cuda.core is missing.
    """
    parse_arch(arch)
    core = _core()
    macros = _macros(name, options)
    heads = dict(headers or {})
    with tempfile.TemporaryDirectory(prefix="openqlink-nvrtc-") as include:
        for header, text in heads.items():
            path = Path(include, header)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        opts = core.ProgramOptions(
            name=name, arch=arch, link_time_optimization=True, relocatable_device_code=True,
            device_as_default_execution_space=True, std="c++17",
            define_macro=macros or None, include_path=[include] if heads else None)
        try:
            program = core.Program(source, "c++", opts)
        except ImportError as exc:
            raise GPUError(f"NVRTC is not installed (pip install 'openqlink[gpu]'): {exc}") \
                from None
        try:
            code = program.compile("ltoir")
        except Exception as exc:
            if type(exc).__name__ != "NVRTCError":   # cuda.core's compile failure
                raise
            text = str(exc).rstrip("\0 \n")
            log_at = text.find("compilation log:")
            raise CompileError(name, text[log_at + len("compilation log:"):].strip()
                               if log_at >= 0 else text) from None
        finally:
            program.close()
    return bytes(code.code)


def numba_compile(func: Callable[..., Any], signature: Sequence[Any], abi_name: str,
                  arch: str) -> tuple[bytes, Any]:
    """Compile the Python function ``func`` for the argument types ``signature`` (numba types)
    to LTO-IR for ``arch`` with numba-cuda, as an ``extern "C"`` device function named
    ``abi_name`` that returns its value (numba's C ABI).

    Returns ``(ltoir, return_type)`` (a numba type; ``none`` for a function returning nothing).
    Raises :class:`CompileError` with numba's message, :class:`GPUError` when numba-cuda is
    missing.
    """
    cc = parse_arch(arch)
    try:
        from numba import cuda
    except ImportError as exc:
        raise GPUError(f"numba-cuda is not installed (pip install 'openqlink[gpu]'): {exc}") \
            from None
    try:
        ltoir, resty = cuda.compile(func, tuple(signature), device=True, abi="c",
                                    output="ltoir", abi_info={"abi_name": abi_name}, cc=cc)
    except Exception as exc:
        raise CompileError(abi_name, f"numba-cuda: {type(exc).__name__}: {exc}") from None
    from numba.core import types
    return bytes(ltoir), types.unliteral(resty)


def nvjitlink_link(inputs: Iterable[LinkInput], arch: str) -> bytes:
    """Link LTO-IR ``inputs`` into one cubin for ``arch`` with nvJitLink (``-lto``), through
    ``cuda.core.Linker``.

    Raises :class:`LinkError` carrying nvJitLink's error log (undefined or duplicate symbols,
    LTO-IR from a newer compiler or for a newer architecture, ...), :class:`GPUError` when
    nvJitLink or cuda.core is missing (cuda.core would fall back to the driver's linker, which
    needs a GPU: openqlink links with nvJitLink only).
    """
    parse_arch(arch)
    items = list(inputs)
    names = tuple(i.name for i in items)
    core = _core()
    try:
        from cuda.bindings import nvjitlink
        nvjitlink.version()
    except Exception as exc:
        raise GPUError(f"nvJitLink is not installed (pip install 'openqlink[gpu]'): {exc}") \
            from None
    objects = [core.ObjectCode.from_ltoir(i.ltoir, name=i.name) for i in items]
    try:
        linker = core.Linker(*objects, options=core.LinkerOptions(
            arch=arch, link_time_optimization=True))
    except nvjitlink.nvJitLinkError as exc:
        raise LinkError(names, str(exc).strip()) from None
    try:
        return bytes(linker.link("cubin").code)
    except nvjitlink.nvJitLinkError as exc:
        raise LinkError(names, str(exc).strip()) from None
    finally:
        linker.close()


def cubin_symbols(cubin: bytes) -> set[str]:
    """Names of the symbols a cubin (64-bit little-endian ELF) defines.

    Raises :class:`GPUError` when ``cubin`` is not such an ELF file.
    """
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise GPUError("not a 64-bit little-endian ELF cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize)
                for i in range(shnum)]
    names: set[str] = set()
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sec[6]]
        str_off = strtab[4]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, _info, _other, shndx = struct.unpack_from("<IBBH", cubin, off)
            if st_name == 0 or shndx == 0:
                continue
            end = cubin.index(b"\0", str_off + st_name)
            names.add(cubin[str_off + st_name:end].decode(errors="replace"))
    return names


def default_cache_dir() -> Path:
    """``$OPENQLINK_CACHE_DIR``, else ``$XDG_CACHE_HOME/openqlink/gpu``, else
    ``~/.cache/openqlink/gpu``."""
    env = os.environ.get("OPENQLINK_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "openqlink" / "gpu"


class LinkCache:
    """Linked cubins by key: in memory, and on disk under ``directory`` (``None``: memory only).

    Keys come from :func:`cache_key` over every input's source, the options, the architecture
    and :func:`toolchain_versions`, so a toolchain upgrade or another GPU never reuses a cubin.
    Disk writes are atomic (temporary file, then rename); a directory that cannot be written
    is logged once and the cache goes on in memory. Counters: :attr:`hits`, :attr:`misses`.
    """

    def __init__(self, directory: Path | str | None = None):
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[str, bytes] = {}
        self.hits = 0
        self.misses = 0
        self._disk_failed = False

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{key}.cubin"

    def get(self, key: str) -> bytes | None:
        """The cubin stored under ``key``, or ``None``."""
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        path = self._path(key)
        if path is not None and path.is_file():
            data = path.read_bytes()
            if data[:4] == b"\x7fELF":
                self._memory[key] = data
                self.hits += 1
                return data
        self.misses += 1
        return None

    def put(self, key: str, cubin: bytes) -> None:
        """Store ``cubin`` under ``key`` (memory, then disk when it can)."""
        self._memory[key] = cubin
        path = self._path(key)
        if path is None or self._disk_failed:
            return
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(cubin)
            os.replace(tmp, path)
        except OSError as exc:
            self._disk_failed = True
            log.warning("link cache: cannot write %s (%s); caching in memory only", path, exc)
            if tmp is not None:
                with contextlib.suppress(OSError):   # no half-written file left behind
                    os.unlink(tmp)

    def clear_memory(self) -> None:
        """Forget the in-memory entries (the disk copies stay)."""
        self._memory.clear()


@functools.cache
def default_cache() -> LinkCache:
    """The process-wide :class:`LinkCache` at :func:`default_cache_dir`."""
    return LinkCache(default_cache_dir())
