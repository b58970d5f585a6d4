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
// rx_poll copies each request from the pinned slot into a staging buffer with 16-byte loads
// issued back to back (the first min(slot_size, QLINK_LOOPBACK_PREFETCH_BYTES) bytes in one
// batch, the rest only when 24 + arg_len needs it), and hands out a staging response buffer;
// so the kernel and the handler touch on-chip memory only. The staging buffers are shared memory
// when slot_size <= QLINK_LOOPBACK_SMEM_BYTES (default 1024), else the ctx's device memory. tx_publish copies
// the response (24 + result_len bytes) into the pinned response slot with 16-byte stores, then
// fences and sets the flag: a handful of PCIe writes per response, whatever the handler does.
//
// Compile-time options: QLINK_LOOPBACK_PREFETCH_BYTES (multiple of 16, default 64);
// QLINK_LOOPBACK_LOAD (how the request is read after the acquire load of its flag: 2, the
// default, plain ld.global, ordered after the acquire by the PTX memory model, as CUDA-Q's
// dispatcher reads its slots; 0 ld.global.cv; 1 ld.volatile.global: both measured slower, their
// loads do not overlap); QLINK_LOOPBACK_SMEM_BYTES (0: always device-memory staging);
// QLINK_LOOPBACK_TRACE (record per-request stage times, %globaltimer, into ctx.trace).
//
// Ref: cuda-quantum realtime/include/cudaq/realtime/daemon/dispatcher/unified_device_transport.cuh
// (hook contract); cudaq_realtime.h cudaq_ringbuffer_t (flags, strides, address-as-flag).
#include "openqlink_dispatch.cuh"

#ifndef QLINK_LOOPBACK_PREFETCH_BYTES
#define QLINK_LOOPBACK_PREFETCH_BYTES 64u
#endif
#ifndef QLINK_LOOPBACK_LOAD
#define QLINK_LOOPBACK_LOAD 2
#endif
#ifndef QLINK_LOOPBACK_SMEM_BYTES
#define QLINK_LOOPBACK_SMEM_BYTES 1024u
#endif
#define QLINK_LOOPBACK_CHUNKS (QLINK_LOOPBACK_PREFETCH_BYTES / 16u)
static_assert(QLINK_LOOPBACK_PREFETCH_BYTES % 16u == 0 && QLINK_LOOPBACK_CHUNKS >= 2,
              "prefetch is whole 16-byte chunks, at least the 24-byte header");

// Device-accessible context (in device memory), filled by openqlink.gpu.loopback (72 bytes).
struct qlink_loopback_ctx {
    volatile uint64_t* rx_flags;  // mapped pinned, device pointer
    volatile uint64_t* tx_flags;  // mapped pinned, device pointer
    uint8_t* rx_data;             // mapped pinned, device pointer
    uint8_t* tx_data;             // mapped pinned, device pointer
    uint8_t* rx_stage;            // device memory, slot_size bytes, 16-byte aligned
    uint8_t* tx_stage;            // device memory, slot_size bytes, 16-byte aligned
    uint64_t* trace;              // device memory, 8 x trace_capacity u64, or NULL
    uint32_t num_slots;
    uint32_t slot_size;           // multiple of 16
    uint32_t trace_capacity;
    uint32_t reserved;
};

struct qlink_loopback_session {
    qlink_loopback_ctx ctx;
    volatile int* shutdown_flag;
    uint32_t next_slot;  // the slot rx_poll waits on
    uint32_t cur_slot;   // the slot handed out, answered by tx_publish
    uint64_t count;      // requests handed out
    uint64_t t_flag;     // trace: flag seen
    uint64_t t_copied;   // trace: request staged
};

static_assert(sizeof(qlink_loopback_ctx) == 72, "ctx layout is shared with Python");
static_assert(sizeof(qlink_loopback_session) <= CUDAQ_DEV_TRANSPORT_SESSION_BYTES,
              "session fits the kernel's storage");

#if QLINK_LOOPBACK_SMEM_BYTES > 0
static __shared__ __align__(16) uint8_t qlink_loopback_rx_smem[QLINK_LOOPBACK_SMEM_BYTES];
static __shared__ __align__(16) uint8_t qlink_loopback_tx_smem[QLINK_LOOPBACK_SMEM_BYTES];
#endif

static __device__ __forceinline__ uint4 qlink_load16(const uint4* p) {
    uint4 v;
#if QLINK_LOOPBACK_LOAD == 0
    asm volatile("ld.global.cv.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#elif QLINK_LOOPBACK_LOAD == 1
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
    v = *p;
#endif
    return v;
}

// Copy whole 16-byte chunks [begin, end) of src to dst: all loads issued before the first store.
static __device__ __forceinline__ void qlink_stage_in(uint8_t* dst, const uint8_t* src,
                                                      uint32_t begin, uint32_t end) {
    for (uint32_t off = begin; off < end; off += QLINK_LOOPBACK_PREFETCH_BYTES) {
        const uint32_t n = min(end - off, QLINK_LOOPBACK_PREFETCH_BYTES) / 16u;
        uint4 v[QLINK_LOOPBACK_CHUNKS];
#pragma unroll
        for (uint32_t i = 0; i < QLINK_LOOPBACK_CHUNKS; ++i) {
            if (i < n) v[i] = qlink_load16(reinterpret_cast<const uint4*>(src + off) + i);
        }
#pragma unroll
        for (uint32_t i = 0; i < QLINK_LOOPBACK_CHUNKS; ++i) {
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
#if QLINK_LOOPBACK_SMEM_BYTES > 0
    if (s->ctx.slot_size <= QLINK_LOOPBACK_SMEM_BYTES) {
        s->ctx.rx_stage = qlink_loopback_rx_smem;
        s->ctx.tx_stage = qlink_loopback_tx_smem;
    }
#endif
    s->shutdown_flag = shutdown_flag;
    s->next_slot = 0;
    s->cur_slot = 0;
    s->count = 0;
    s->t_flag = s->t_copied = 0;
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
#ifdef QLINK_LOOPBACK_TRACE
    s->t_flag = qlink_globaltimer_ns();
#endif
    const uint32_t stride = s->ctx.slot_size;
    const uint8_t* src = s->ctx.rx_data + static_cast<uint64_t>(slot) * stride;
    const uint32_t first = min(stride, QLINK_LOOPBACK_PREFETCH_BYTES);
    qlink_stage_in(s->ctx.rx_stage, src, 0, first);
    const uint32_t arg_len = reinterpret_cast<const qlink_rpc_header*>(s->ctx.rx_stage)->arg_len;
    if (arg_len <= stride - QLINK_RPC_HEADER_BYTES) {
        const uint32_t need = (QLINK_RPC_HEADER_BYTES + arg_len + 15u) & ~15u;
        if (need > first) qlink_stage_in(s->ctx.rx_stage, src, first, min(need, stride));
    }
#ifdef QLINK_LOOPBACK_TRACE
    s->t_copied = qlink_globaltimer_ns();
#endif
    s->cur_slot = slot;
    s->next_slot = slot + 1 == s->ctx.num_slots ? 0 : slot + 1;
    *out_request = s->ctx.rx_stage;
    *out_response = s->ctx.tx_stage;
    return CUDAQ_RX_DEV_READY;
}

extern "C" __device__ void cudaq_dev_tx_publish(void* session, void* response) {
    qlink_loopback_session* s = static_cast<qlink_loopback_session*>(session);
    const uint32_t slot = s->cur_slot;
    const uint32_t stride = s->ctx.slot_size;
#ifdef QLINK_LOOPBACK_TRACE
    const uint64_t t_publish = qlink_globaltimer_ns();
#endif
    // The staged response (device memory) -> the pinned response slot, whole 16-byte chunks.
    const uint32_t result_len = static_cast<const qlink_rpc_response*>(response)->result_len;
    const uint32_t bytes =
        QLINK_RPC_HEADER_BYTES + min(result_len, stride - QLINK_RPC_HEADER_BYTES);
    const uint32_t end = min((bytes + 15u) & ~15u, stride);
    uint8_t* dst = s->ctx.tx_data + static_cast<uint64_t>(slot) * stride;
    const uint4* src = static_cast<const uint4*>(response);
    for (uint32_t i = 0; i < end / 16u; ++i) reinterpret_cast<uint4*>(dst)[i] = src[i];
#ifdef QLINK_LOOPBACK_TRACE
    const uint64_t t_copied_out = qlink_globaltimer_ns();
#endif
    __threadfence_system();
#ifdef QLINK_LOOPBACK_TRACE
    const uint64_t t_fenced = qlink_globaltimer_ns();
#endif
    s->ctx.tx_flags[slot] = reinterpret_cast<uint64_t>(dst);
    s->ctx.rx_flags[slot] = 0;
#ifdef QLINK_LOOPBACK_TRACE
    if (s->ctx.trace != nullptr && s->ctx.trace_capacity != 0) {
        uint64_t* t = s->ctx.trace + 8u * (s->count % s->ctx.trace_capacity);
        t[0] = s->t_copied - s->t_flag;        // request copied in
        t[1] = t_publish - s->t_copied;        // lookup, handler, response header
        t[2] = t_copied_out - t_publish;       // response copied out
        t[3] = t_fenced - t_copied_out;        // __threadfence_system
        t[4] = qlink_globaltimer_ns() - t_fenced;  // flag stores
        t[5] = qlink_globaltimer_ns() - s->t_flag; // flag seen -> published
    }
#endif
    ++s->count;
}
