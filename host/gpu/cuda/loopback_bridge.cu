// openqlink GPU loopback bridge: the unified transport hooks over mapped pinned host memory.
//
// Memory (one cuMemHostAlloc(DEVICEMAP) allocation, seen by the host and, through its device
// pointer, by the kernel): the request ring rx_data and the response ring tx_data, num_slots
// slots of `stride` bytes each (stride = 8 + slot_size rounded up to 64; slots 64-byte aligned).
// A slot is [seq: u64][message: RPCHeader / RPCResponse + payload, at most slot_size bytes], so
// the sequence word and the first 56 message bytes share the slot's first 64-byte line.
//
// Sequence words: request k (k = 1, 2, ... since the kernel started) goes into slot
// (k - 1) % num_slots; the host writes the message, then stores k in the slot's sequence word
// (x86-64 stores are seen in program order). The kernel waits for the word to equal k, takes
// the request, writes the response message into the same response slot, fences
// (__threadfence_system) and stores k in the response slot's sequence word; the host waits for
// that, reads the response and may reuse the slot. Nobody clears a word: a slot's old value
// (k - num_slots, or 0) never equals the one awaited.
//
// Shutdown: rx_poll reads the shutdown flag (ld.acquire.sys) every QLINK_LOOPBACK_SHUTDOWN_SPINS
// polls of an empty slot (default 256). Once it has seen the flag it polls the slot once more and
// returns SHUTDOWN only if the request is still not there: the host stores a request's word
// before it sets the flag, so the acquire makes a request posted before stop() visible to that
// last poll, and it is answered (then the next slot is looked at once, and so on).
//
// rx_poll, when four or more lanes of a warp call the hooks (the built-in kernel runs one warp):
// four lanes read the slot's first 64-byte line with ONE coalesced load instruction (16 bytes
// each, ld.acquire.sys), so each poll is one 64-byte PCIe read that returns the sequence word
// and a request of up to 56 bytes (header + 32 argument bytes) together; the poll is repeated
// until the word equals k. That the bytes beside the word are the request's, not older ones,
// rests on a hardware property, not on the PTX memory model (which orders nothing between the
// lanes' four loads): the root complex serves one aligned 64-byte read as one coherent read of
// the CPU's cache line, and the CPU's stores to that line are ordered, so a line that holds k
// holds the message written before it (docs/gpu.md; benchmarks/gpu_roundtrip.py counts any
// wrong response). The rest of a longer request (bytes 56 on) is read after a __syncwarp with
// strong loads, one more PCIe round trip. With fewer lanes (CUDA-Q's single thread), or
// QLINK_LOOPBACK_LINE_POLL=0, the leader polls the 8-byte word with ld.acquire.sys and then
// reads the request (ordered by the acquire): two PCIe round trips.
//
// The request is staged in shared memory (device memory for slots above
// QLINK_LOOPBACK_SMEM_BYTES, default 1024) in the slot's own layout, so the kernel and the
// handler read on-chip memory only. The response is written in place: rx_poll hands out the
// pinned response slot itself, the kernel's stores (header, result) go there, and tx_publish
// lets the lanes meet (__syncwarp, which orders their stores before what the leader does next)
// and the leader fence and store the sequence word: the release pattern of the PTX model,
// cumulative over every lane's stores. (With QLINK_LOOPBACK_DIRECT_TX=0 the response is staged
// on chip too and tx_publish copies it into the pinned slot with 16-byte strong stores spread
// over the lanes before that: about 0.1 us more per request on an H100, docs/benchmarks.md.)
//
// Compile-time options: QLINK_LOOPBACK_LINE_POLL (1 default, 0: the two-round-trip poll);
// QLINK_LOOPBACK_SHUTDOWN_SPINS (256 default: empty polls between two reads of the shutdown
// flag); QLINK_LOOPBACK_FENCE (0 default: fence.sc.sys, i.e. __threadfence_system; 1: fence.acq_rel.sys,
// also a release pattern in the PTX model; 2, diagnostic only: a response that fits the first
// line goes out with its sequence word in the same coalesced store and no fence, resting on the
// same line property as the request side); QLINK_LOOPBACK_SMEM_BYTES (0: always device-memory
// staging); QLINK_LOOPBACK_DIRECT_TX (1, the default: the response written in place; 0: staged
// on chip and copied out, the default with QLINK_LOOPBACK_FENCE=2, whose one-line store needs
// the copy); QLINK_LOOPBACK_TRACE (record per-request stage times, %globaltimer, into
// ctx.trace).
//
// Ref: cuda-quantum realtime/include/cudaq/realtime/daemon/dispatcher/unified_device_transport.cuh
// (hook contract); PTX ISA "Memory Consistency Model" (release/acquire patterns, bar.warp.sync).
#include "openqlink_dispatch.cuh"

#ifndef QLINK_LOOPBACK_LINE_POLL
#define QLINK_LOOPBACK_LINE_POLL 1
#endif
#ifndef QLINK_LOOPBACK_FENCE
#define QLINK_LOOPBACK_FENCE 0
#endif
#ifndef QLINK_LOOPBACK_SMEM_BYTES
#define QLINK_LOOPBACK_SMEM_BYTES 1024u
#endif
#ifndef QLINK_LOOPBACK_DIRECT_TX
#if QLINK_LOOPBACK_FENCE == 2
#define QLINK_LOOPBACK_DIRECT_TX 0
#else
#define QLINK_LOOPBACK_DIRECT_TX 1
#endif
#endif
#ifndef QLINK_LOOPBACK_SHUTDOWN_SPINS
#define QLINK_LOOPBACK_SHUTDOWN_SPINS 256u
#endif
#if QLINK_LOOPBACK_DIRECT_TX && QLINK_LOOPBACK_FENCE == 2
#error "QLINK_LOOPBACK_FENCE=2 sends the sequence word with the copied line: not with DIRECT_TX"
#endif
static_assert(QLINK_LOOPBACK_SHUTDOWN_SPINS >= 1u, "the flag is read every N >= 1 empty polls");
#define QLINK_LOOPBACK_SEQ_BYTES 8u
#define QLINK_LOOPBACK_LINE_BYTES 64u

// Device-accessible context (in device memory), filled by openqlink.gpu.loopback (56 bytes).
struct qlink_loopback_ctx {
    uint8_t* rx_data;         // request ring, mapped pinned, device pointer
    uint8_t* tx_data;         // response ring, mapped pinned, device pointer
    uint8_t* rx_stage;        // device memory, stride bytes, 16-byte aligned
    uint8_t* tx_stage;        // device memory, stride bytes, 16-byte aligned
    uint64_t* trace;          // device memory, 8 x trace_capacity u64, or NULL
    uint32_t num_slots;
    uint32_t slot_size;       // message capacity, multiple of 16
    uint32_t stride;          // bytes per slot: 8 + slot_size rounded up to 64
    uint32_t trace_capacity;
};

struct qlink_loopback_session {
    qlink_loopback_ctx ctx;
    volatile int* shutdown_flag;
    uint64_t seq;              // sequence number of the request handed out last (0: none)
    uint64_t t_flag;           // trace: request seen
    uint64_t t_copied;         // trace: request staged
    uint64_t c_flag;           // trace: request seen, SM clock (clock64)
    uint64_t c_copied;         // trace: request staged, SM clock
    uint32_t next_slot;        // the slot rx_poll waits on
    uint32_t cur_slot;         // the slot handed out, answered by tx_publish
    uint32_t mask;             // the lanes that attached
    uint32_t lanes;            // how many
    uint32_t rank;             // this lane's rank among them (0: the leader)
    uint32_t rank_lane[4];     // lane ids of ranks 0..3 (the readers of the first line)
    uint32_t stopping;         // the shutdown flag was seen: one more look at each slot, no wait
};

static_assert(sizeof(qlink_loopback_ctx) == 56, "ctx layout is shared with Python");
static_assert(sizeof(qlink_loopback_session) <= CUDAQ_DEV_TRANSPORT_SESSION_BYTES,
              "session fits the kernel's storage");

#if QLINK_LOOPBACK_SMEM_BYTES > 0
static __shared__ __align__(16) uint8_t qlink_loopback_rx_smem[QLINK_LOOPBACK_SMEM_BYTES];
static __shared__ __align__(16) uint8_t qlink_loopback_tx_smem[QLINK_LOOPBACK_SMEM_BYTES];
#endif

static __device__ __forceinline__ void qlink_store_relaxed_sys_v4(void* p, uint4 v) {
    asm volatile("st.relaxed.sys.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

static __device__ __forceinline__ void qlink_loopback_fence() {
#if QLINK_LOOPBACK_FENCE == 1
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
    __threadfence_system();
#endif
}

// Bytes of a slot [0, end) that hold a message of `message_len` bytes (whole 16-byte chunks,
// the sequence word included), bounded by the slot.
static __device__ __forceinline__ uint32_t qlink_loopback_end(uint32_t message_len,
                                                              uint32_t slot_size) {
    const uint32_t n = min(message_len, slot_size);
    return (QLINK_LOOPBACK_SEQ_BYTES + n + 15u) & ~15u;
}

extern "C" __device__ void* cudaq_dev_transport_attach(void* storage, void* ctx,
                                                       volatile int* shutdown_flag) {
    if (storage == nullptr || ctx == nullptr) return nullptr;
    qlink_loopback_session* s = static_cast<qlink_loopback_session*>(storage);
    s->ctx = *static_cast<const qlink_loopback_ctx*>(ctx);
    const qlink_loopback_ctx& c = s->ctx;
    if (c.num_slots == 0 || c.slot_size < 32 || (c.slot_size & 15u) != 0 ||
        (c.stride % QLINK_LOOPBACK_LINE_BYTES) != 0 ||
        c.stride < c.slot_size + QLINK_LOOPBACK_SEQ_BYTES) {
        return nullptr;
    }
#if QLINK_LOOPBACK_SMEM_BYTES > 0
    if (c.stride <= QLINK_LOOPBACK_SMEM_BYTES) {
        s->ctx.rx_stage = qlink_loopback_rx_smem;
        s->ctx.tx_stage = qlink_loopback_tx_smem;
    }
#endif
    uint32_t lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    const uint32_t mask = __activemask();
    s->mask = mask;
    s->lanes = __popc(mask);
    s->rank = __popc(mask & ((1u << lane) - 1u));
    uint32_t m = mask;
#pragma unroll
    for (uint32_t r = 0; r < 4; ++r) {
        s->rank_lane[r] = m != 0 ? static_cast<uint32_t>(__ffs(m) - 1) : 0u;
        m &= m - 1u;
    }
    s->shutdown_flag = shutdown_flag;
    s->seq = 0;
    s->next_slot = 0;
    s->cur_slot = 0;
    s->t_flag = s->t_copied = s->c_flag = s->c_copied = 0;
    s->stopping = 0;
    return s;
}

extern "C" __device__ cudaq_rx_dev_status_t cudaq_dev_rx_poll(void* session, void** out_request,
                                                              void** out_response) {
    qlink_loopback_session* s = static_cast<qlink_loopback_session*>(session);
    const uint32_t slot = s->next_slot;
    const uint64_t want = s->seq + 1;
    const uint32_t mask = s->mask;
    const uint32_t leader = s->rank_lane[0];
    const uint32_t rank = s->rank;
    const uint8_t* src = s->ctx.rx_data + static_cast<uint64_t>(slot) * s->ctx.stride;
    uint8_t* stage = s->ctx.rx_stage;
    uint32_t spins = 0;
#if QLINK_LOOPBACK_LINE_POLL
    if (s->lanes >= 4) {
        // One 64-byte read per poll: ranks 0..3 load the line's four 16-byte parts together.
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        for (;;) {
            __syncwarp(mask);  // the four loads must be one instruction of the converged lanes
            if (rank < 4) v = qlink_load_acquire_sys_v4(src + 16u * rank);
            const uint64_t seq = __shfl_sync(
                mask, (static_cast<uint64_t>(v.y) << 32) | static_cast<uint64_t>(v.x), leader);
            if (seq == want) break;
            if (s->stopping) return CUDAQ_RX_DEV_SHUTDOWN;  // looked again after the flag
            if (++spins >= QLINK_LOOPBACK_SHUTDOWN_SPINS) {
                spins = 0;
                int stop = 0;
                if (rank == 0) stop = qlink_load_acquire_sys_s32(s->shutdown_flag);
                // Seen: poll the slot once more (after the acquire, at the loop's top) before
                // giving up, so a request posted before the flag is still taken.
                s->stopping = static_cast<uint32_t>(__shfl_sync(mask, stop, leader) != 0);
            }
        }
#ifdef QLINK_LOOPBACK_TRACE
        s->t_flag = qlink_globaltimer_ns();
        s->c_flag = clock64();
#endif
        if (rank < 4) reinterpret_cast<uint4*>(stage)[rank] = v;
        // arg_len is message bytes 8..11: slot bytes 16..19, the first word of rank 1's part.
        const uint32_t arg_len = __shfl_sync(mask, v.x, s->rank_lane[1]);
        const uint32_t end = qlink_loopback_end(
            arg_len <= s->ctx.slot_size ? QLINK_RPC_HEADER_BYTES + arg_len : s->ctx.slot_size,
            s->ctx.slot_size);
        if (end > QLINK_LOOPBACK_LINE_BYTES) {
            // The rest of a longer request: after the leader's acquire (bar.warp.sync orders it
            // for every lane), one strong 16-byte load per lane and chunk.
            __syncwarp(mask);
            for (uint32_t off = QLINK_LOOPBACK_LINE_BYTES + 16u * rank; off < end;
                 off += 16u * s->lanes) {
                *reinterpret_cast<uint4*>(stage + off) = qlink_load_relaxed_sys_v4(src + off);
            }
        }
        __syncwarp(mask);
    } else
#endif
    {
        // The leader polls the sequence word, then reads the request (ordered by the acquire).
        int stop = 0;
        if (rank == 0) {
            const volatile uint64_t* word = reinterpret_cast<const volatile uint64_t*>(src);
            while (qlink_load_acquire_sys(word) != want) {
                if (s->stopping) {  // looked again after the flag: nothing there
                    stop = 1;
                    break;
                }
                if (++spins >= QLINK_LOOPBACK_SHUTDOWN_SPINS) {
                    spins = 0;
                    // Seen: poll the word once more (after the acquire) before giving up.
                    s->stopping = static_cast<uint32_t>(
                        qlink_load_acquire_sys_s32(s->shutdown_flag) != 0);
                }
            }
        }
        if (__shfl_sync(mask, stop, leader) != 0) return CUDAQ_RX_DEV_SHUTDOWN;
#ifdef QLINK_LOOPBACK_TRACE
        s->t_flag = qlink_globaltimer_ns();
        s->c_flag = clock64();
#endif
        if (rank == 0) {
            // The first line, then (if the header asks for it) the rest: loads issued together.
            uint4 v[4];
#pragma unroll
            for (uint32_t i = 0; i < 4; ++i) v[i] = reinterpret_cast<const uint4*>(src)[i];
#pragma unroll
            for (uint32_t i = 0; i < 4; ++i) reinterpret_cast<uint4*>(stage)[i] = v[i];
            const uint32_t arg_len = v[1].x;
            const uint32_t end = qlink_loopback_end(
                arg_len <= s->ctx.slot_size ? QLINK_RPC_HEADER_BYTES + arg_len
                                            : s->ctx.slot_size,
                s->ctx.slot_size);
            for (uint32_t off = QLINK_LOOPBACK_LINE_BYTES; off < end; off += 64u) {
                const uint32_t n = min(end - off, 64u) / 16u;
#pragma unroll
                for (uint32_t i = 0; i < 4; ++i) {
                    if (i < n) v[i] = reinterpret_cast<const uint4*>(src + off)[i];
                }
#pragma unroll
                for (uint32_t i = 0; i < 4; ++i) {
                    if (i < n) reinterpret_cast<uint4*>(stage + off)[i] = v[i];
                }
            }
        }
        __syncwarp(mask);
    }
#ifdef QLINK_LOOPBACK_TRACE
    s->t_copied = qlink_globaltimer_ns();
    s->c_copied = clock64();
#endif
    s->seq = want;
    s->cur_slot = slot;
    s->next_slot = slot + 1 == s->ctx.num_slots ? 0 : slot + 1;
    *out_request = stage + QLINK_LOOPBACK_SEQ_BYTES;
#if QLINK_LOOPBACK_DIRECT_TX
    *out_response = s->ctx.tx_data + static_cast<uint64_t>(slot) * s->ctx.stride +
                    QLINK_LOOPBACK_SEQ_BYTES;
#else
    *out_response = s->ctx.tx_stage + QLINK_LOOPBACK_SEQ_BYTES;
#endif
    return CUDAQ_RX_DEV_READY;
}

extern "C" __device__ void cudaq_dev_tx_publish(void* session, void* response) {
    qlink_loopback_session* s = static_cast<qlink_loopback_session*>(session);
    __syncwarp(s->mask);  // what any calling lane wrote into the response frame
#ifdef QLINK_LOOPBACK_TRACE
    const uint64_t t_publish = qlink_globaltimer_ns();
    const uint64_t c_publish = clock64();
#endif
    const uint32_t slot = s->cur_slot;
    const uint32_t rank = s->rank;
    const uint64_t seq = s->seq;
    // The staged frame has the slot's layout: copy whole 16-byte chunks, the lanes side by side.
    const uint8_t* stage = static_cast<const uint8_t*>(response) - QLINK_LOOPBACK_SEQ_BYTES;
    // (With DIRECT_TX the response is in pinned memory: not read back, nothing to copy.)
    const uint32_t result_len = QLINK_LOOPBACK_DIRECT_TX
        ? 0u : static_cast<const qlink_rpc_response*>(response)->result_len;
    const uint32_t room = s->ctx.slot_size - QLINK_RPC_HEADER_BYTES;
    const uint32_t end = QLINK_LOOPBACK_DIRECT_TX ? 0u : qlink_loopback_end(
        QLINK_RPC_HEADER_BYTES + min(result_len, room), s->ctx.slot_size);
    uint8_t* dst = s->ctx.tx_data + static_cast<uint64_t>(slot) * s->ctx.stride;
#if QLINK_LOOPBACK_FENCE == 2
    const bool one_line = end <= QLINK_LOOPBACK_LINE_BYTES;
#else
    const bool one_line = false;
#endif
    for (uint32_t off = 16u * rank; off < end; off += 16u * s->lanes) {
        uint4 v = *reinterpret_cast<const uint4*>(stage + off);
        if (off == 0) {  // the sequence word: stored last, unless it rides in the same line store
            v.x = one_line ? static_cast<uint32_t>(seq) : 0u;
            v.y = one_line ? static_cast<uint32_t>(seq >> 32) : 0u;
        }
        qlink_store_relaxed_sys_v4(dst + off, v);
    }
    // Every lane's stores, then the leader's fence and sequence word: the lanes meet first
    // (bar.warp.sync orders each lane's stores before what the leader does after it), so the
    // leader's fence + store is a release of all of them, not of its own stores only.
    __syncwarp(s->mask);
#ifdef QLINK_LOOPBACK_TRACE
    const uint64_t t_copied_out = qlink_globaltimer_ns();
#endif
    if (!one_line && rank == 0) qlink_loopback_fence();
#ifdef QLINK_LOOPBACK_TRACE
    const uint64_t t_fenced = qlink_globaltimer_ns();
#endif
    if (!one_line && rank == 0) *reinterpret_cast<volatile uint64_t*>(dst) = seq;
#ifdef QLINK_LOOPBACK_TRACE
    if (rank == 0 && s->ctx.trace != nullptr && s->ctx.trace_capacity != 0) {
        uint64_t* t = s->ctx.trace + 8u * ((seq - 1) % s->ctx.trace_capacity);
        t[0] = s->t_copied - s->t_flag;            // request staged
        t[1] = t_publish - s->t_copied;            // lookup, handler, response header
        t[2] = t_copied_out - t_publish;           // response copied out
        t[3] = t_fenced - t_copied_out;            // fence
        t[4] = qlink_globaltimer_ns() - t_fenced;  // sequence word store
        t[5] = qlink_globaltimer_ns() - s->t_flag; // request seen -> published
        t[6] = clock64() - s->c_flag;              // the same in SM clock cycles
        t[7] = c_publish - s->c_copied;            // t[1] in SM clock cycles
    }
#endif
}
