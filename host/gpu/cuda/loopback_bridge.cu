// openqlink GPU loopback bridge: the unified transport hooks over mapped pinned host memory.
//
// Memory (one cuMemHostAlloc(DEVICEMAP) allocation, seen by the host and, through its device
// pointer, by the kernel): rx_flags[num_slots] u64, tx_flags[num_slots] u64, then the request
// ring rx_data (num_slots x slot_size bytes) and the response ring tx_data (same geometry).
// Flags follow CUDA-Q's address-as-flag convention: 0 = empty; the host sets rx_flags[s] to the
// address of request slot s after writing the request; the kernel sets tx_flags[s] to the
// address of response slot s after writing the response (and a __threadfence_system), then
// clears rx_flags[s]. The host reads the response, then clears tx_flags[s]; slot s is free
// again when both flags are 0. The kernel takes slots in strict ring order from slot 0, and
// only the flag's being non-zero matters (the slot address always comes from the ring order).
//
// rx_poll copies each request from the pinned slot into a device-memory staging buffer with
// 16-byte loads issued back to back (the first min(slot_size, 128) bytes in one batch, the rest
// only when 24 + arg_len needs it), so the handler reads device memory, not PCIe. Responses are
// written straight into the pinned response slot.
//
// Ref: cuda-quantum realtime/include/cudaq/realtime/daemon/dispatcher/unified_device_transport.cuh
// (hook contract); cudaq_realtime.h cudaq_ringbuffer_t (flags, strides, address-as-flag).
#include "openqlink_dispatch.cuh"

#define QLINK_LOOPBACK_PREFETCH_BYTES 128u

// Device-accessible context (in device memory), filled by openqlink.gpu.loopback.
struct qlink_loopback_ctx {
    volatile uint64_t* rx_flags;  // mapped pinned, device pointer
    volatile uint64_t* tx_flags;  // mapped pinned, device pointer
    uint8_t* rx_data;             // mapped pinned, device pointer
    uint8_t* tx_data;             // mapped pinned, device pointer
    uint8_t* stage;               // device memory, slot_size bytes, 16-byte aligned
    uint32_t num_slots;
    uint32_t slot_size;           // multiple of 16
};

struct qlink_loopback_session {
    qlink_loopback_ctx ctx;
    volatile int* shutdown_flag;
    uint32_t next_slot;  // the slot rx_poll waits on
    uint32_t cur_slot;   // the slot handed out, answered by tx_publish
};

static_assert(sizeof(qlink_loopback_session) <= CUDAQ_DEV_TRANSPORT_SESSION_BYTES,
              "session fits the kernel's storage");

static __device__ __forceinline__ void qlink_copy16(uint8_t* dst, const uint8_t* src,
                                                    uint32_t begin, uint32_t end) {
    // Loads bypass the caches (.cv: fetch again), all issued before the first store.
    uint4 v[QLINK_LOOPBACK_PREFETCH_BYTES / 16];
    for (uint32_t off = begin; off < end; off += QLINK_LOOPBACK_PREFETCH_BYTES) {
        const uint32_t n = min(end - off, QLINK_LOOPBACK_PREFETCH_BYTES) / 16;
#pragma unroll
        for (uint32_t i = 0; i < QLINK_LOOPBACK_PREFETCH_BYTES / 16; ++i) {
            if (i < n) {
                const uint4* p = reinterpret_cast<const uint4*>(src + off) + i;
                asm volatile("ld.global.cv.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w)
                             : "l"(p));
            }
        }
#pragma unroll
        for (uint32_t i = 0; i < QLINK_LOOPBACK_PREFETCH_BYTES / 16; ++i) {
            if (i < n) reinterpret_cast<uint4*>(dst + off)[i] = v[i];
        }
    }
}

extern "C" __device__ void* cudaq_dev_transport_attach(void* storage, void* ctx,
                                                       volatile int* shutdown_flag) {
    if (storage == nullptr || ctx == nullptr) return nullptr;
    qlink_loopback_session* s = static_cast<qlink_loopback_session*>(storage);
    s->ctx = *static_cast<const qlink_loopback_ctx*>(ctx);
    if (s->ctx.num_slots == 0 || s->ctx.slot_size < 32 || (s->ctx.slot_size & 15u) != 0) {
        return nullptr;
    }
    s->shutdown_flag = shutdown_flag;
    s->next_slot = 0;
    s->cur_slot = 0;
    return s;
}

extern "C" __device__ cudaq_rx_dev_status_t cudaq_dev_rx_poll(void* session, void** out_request,
                                                              void** out_response) {
    qlink_loopback_session* s = static_cast<qlink_loopback_session*>(session);
    const uint32_t slot = s->next_slot;
    const volatile uint64_t* flag = s->ctx.rx_flags + slot;
    uint32_t spins = 0;
    while (qlink_load_acquire_sys(flag) == 0) {
        if ((++spins & 255u) == 0 && *s->shutdown_flag != 0) return CUDAQ_RX_DEV_SHUTDOWN;
    }
    const uint32_t stride = s->ctx.slot_size;
    const uint8_t* src = s->ctx.rx_data + static_cast<uint64_t>(slot) * stride;
    const uint32_t first = min(stride, QLINK_LOOPBACK_PREFETCH_BYTES);
    qlink_copy16(s->ctx.stage, src, 0, first);
    const uint32_t arg_len = reinterpret_cast<const qlink_rpc_header*>(s->ctx.stage)->arg_len;
    if (arg_len <= stride - QLINK_RPC_HEADER_BYTES) {
        const uint32_t need = (QLINK_RPC_HEADER_BYTES + arg_len + 15u) & ~15u;
        if (need > first) qlink_copy16(s->ctx.stage, src, first, min(need, stride));
    }
    s->cur_slot = slot;
    s->next_slot = slot + 1 == s->ctx.num_slots ? 0 : slot + 1;
    *out_request = s->ctx.stage;
    *out_response = s->ctx.tx_data + static_cast<uint64_t>(slot) * stride;
    return CUDAQ_RX_DEV_READY;
}

extern "C" __device__ void cudaq_dev_tx_publish(void* session, void* response) {
    qlink_loopback_session* s = static_cast<qlink_loopback_session*>(session);
    const uint32_t slot = s->cur_slot;
    __threadfence_system();
    s->ctx.tx_flags[slot] = reinterpret_cast<uint64_t>(response);
    s->ctx.rx_flags[slot] = 0;
}
