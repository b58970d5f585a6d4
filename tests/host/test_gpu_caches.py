"""The GPU build caches, checked on the host (no GPU needed): handler keys, the link cache.

The cache key of a numba DEVICE_CALL handler covers everything its compiled code depends on: a
cubin served from the cache for another function is a silent wrong answer on the GPU, so two
handlers that compile differently must never share a key, computed on the host before anything
is compiled.
"""

from __future__ import annotations

import types

import numpy as np

from openqlink.dispatch import DispatchMode, FunctionEntry
from openqlink.gpu import NumbaHandler
from openqlink.wire.rpc import PayloadType as P

TABLE = np.array([1, 2, 3], dtype=np.int32)
SCALE = 3


def _helper(a):
    return a * SCALE


def key(func) -> str:
    entry = FunctionEntry("h", DispatchMode.DEVICE_CALL, (P.INT32,), (P.INT32,), None)
    return NumbaHandler(func).key(entry, "sm_90")


def closure(k):
    def handler(a):
        return a + k
    return handler


def test_closures_over_different_values_get_different_keys():
    assert key(closure(1)) != key(closure(2))
    assert key(closure(1)) == key(closure(1))          # the cache still hits


def test_default_arguments_are_part_of_the_key():
    def handler(a, k=1):
        return a + k

    same_code_other_default = types.FunctionType(handler.__code__, handler.__globals__,
                                                  handler.__name__, (2,))
    same_code_other_default.__qualname__ = handler.__qualname__
    assert key(handler) != key(same_code_other_default)


def test_global_arrays_and_called_functions_are_part_of_the_key():
    global TABLE, _helper

    def handler(a):
        return TABLE[a] + _helper(a)

    before = key(handler)
    saved_table, saved_helper = TABLE, _helper
    try:
        TABLE = np.array([1, 2, 4], dtype=np.int32)
        assert key(handler) != before, "a changed global array must change the key"
        TABLE = saved_table
        assert key(handler) == before

        def _helper(a):       # noqa: F811  (the called function's code changes)
            return a * SCALE + 1

        assert key(handler) != before, "a changed callee must change the key"
    finally:
        TABLE, _helper = saved_table, saved_helper


def test_a_value_it_cannot_fingerprint_is_never_served_from_the_cache():
    class Opaque:
        pass

    thing = Opaque()

    def handler(a):
        return a + thing.value

    assert key(handler) != key(handler)


def test_a_failed_cache_write_leaves_no_partial_file(tmp_path, monkeypatch):
    """A disk write that fails half-way (full disk, here: the final rename) must not leave its
    temporary file in the cache folder; the entry stays cached in memory."""
    from openqlink.gpu import toolchain

    cache = toolchain.LinkCache(tmp_path)

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(toolchain.os, "replace", fail)
    cache.put("k" * 64, b"cubin")
    assert list(tmp_path.iterdir()) == []
    assert cache.get("k" * 64) == b"cubin"
