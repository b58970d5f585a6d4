// openqlink GPU RoCE endpoint: the unified transport hooks over raw RoCEv2 frames in mapped
// pinned host memory. The kernel checks each request frame as the host's UCQueuePair does
// (roce_frames.cuh, the same code the host's tests run), hands the RPC request to the dispatch
// kernel, and writes the complete UC SEND_ONLY response frame; whoever moves frames (the host,
// a NIC) only copies them between the wire and the rings.
//
// Memory (one cuMemHostAlloc(DEVICEMAP) allocation; openqlink.gpu.frames.FrameRings):
//
//   control (256 bytes)   shutdown_flag i32 @0, processed u64 @8 (the kernel's),
//                         rx_consumed u64 @16 (kernel: request frames taken),
//                         tx_taken u64 @24 (host: response frames read),
//                         PSN state @64 (tx_psn u32, rx_epsn u32; qlink_roce_psn),
//                         counters @72 (18 x u64, openqlink.roce.RX_COUNTER_NAMES order),
//                         last_frame_ns u64 @216 (the last frame's time in the kernel: from
//                         its sequence word seen to its response published, or its drop)
//   rx ring               num_frames slots of rx_stride bytes: request frames, host -> GPU
//   tx ring               num_frames slots of tx_stride bytes: response frames, GPU -> host
//
// A slot is [seq: u64 @0][length: u32 @8][frame @ frame_offset]: 14 in the rx ring, 18 in the
// tx ring (reserved bytes between), so that the RPC request of a request frame (after its
// Ethernet, IPv4, UDP, BTH, RETH and ImmDt headers, 74 bytes) and the RPCResponse of a response
// frame (after 54 header bytes) both start at 8 mod 16 of the slot, where the dispatch kernel
// wants its 8-byte aligned frames. stride = frame_offset + the ring's frame capacity, rounded up
// to 64 bytes. Frames have no FCS.
//
// Sequence words, as the loopback bridge's: frame k (1, 2, ... since the kernel started) of a
// ring is in slot (k - 1) % num_frames; the writer stores the length and the frame, then k in
// the slot's word (the host: x86-64 stores, seen in order; the kernel: __syncwarp, then the
// leader's __threadfence_system and store). The reader waits for k there. Nobody clears a word.
// Flow control: the host posts rx frame k only while k - 1 - rx_consumed < num_frames (the
// kernel stores rx_consumed once it has copied a frame); the kernel writes tx frame j only while
// j - 1 - tx_taken < num_frames (it reads tx_taken again, ld.acquire.sys, only when the ring
// looks full: back-pressure, the kernel waits).
//
// Per request frame (one warp; the frame check, the response build and the ICRCs are the
// leader's, the copies are spread over the lanes): the frame is staged in shared memory
// (device memory for slots above QLINK_FRAMES_SMEM_BYTES) with one 64-byte line read by four
// lanes per poll, then the rest (the loopback bridge's one-line poll, docs/gpu.md), and
// rx_consumed is stored. qlink_roce_check_request checks it; a dropped frame is counted by
// reason and never reaches a handler. An accepted one is handed to the kernel (request = its
// RPC bytes in the stage; response = the RPCResponse's place in the tx stage). A request whose
// header asks for more argument bytes than the frame carries gets its staged arg_len set to
// 0xFFFFFFFF, so that the kernel answers -3 (TRUNCATED) as the host dispatcher does; one shorter
// than the 24-byte header is answered -3 by the bridge itself (request_id and ptp_timestamp
// read as zero-padded, as the host does). tx_publish builds the SEND_ONLY frame around the
// response (qlink_roce_build_send_only: the next TX PSN, the QSC's QPN, IPv4 checksum, ICRC)
// in the tx stage and copies it into the tx ring. After each frame, dropped or answered, the
// lanes store the PSN state and the 18 counters into the control block (one burst of posted
// writes, after the response).
//
// Shutdown: the loopback bridge's rule. While the next rx slot stays empty the flag is read
// every QLINK_FRAMES_SHUTDOWN_SPINS polls (ld.acquire.sys); once it is seen, the slot is polled
// once more, and the kernel stops only if no frame is there: a frame posted before stop() is
// checked and, when accepted, answered.
//
// Compile-time options: QLINK_FRAMES_SHUTDOWN_SPINS (256), QLINK_FRAMES_SMEM_BYTES (stage size
// in shared memory per direction, 2048; 0: device memory always).
//
// Ref: cuda-quantum realtime/include/cudaq/realtime/daemon/dispatcher/unified_device_transport.cuh
// (hook contract); IBTA Vol 1 9.2-9.8, Annex A17 (frames, see roce_frames.cuh); PTX ISA "Memory
// Consistency Model" (release/acquire patterns, bar.warp.sync).
#include "openqlink_dispatch.cuh"
#include "roce_frames.cuh"

#ifndef QLINK_FRAMES_SHUTDOWN_SPINS
#define QLINK_FRAMES_SHUTDOWN_SPINS 256u
#endif
#ifndef QLINK_FRAMES_SMEM_BYTES
#define QLINK_FRAMES_SMEM_BYTES 2048u
#endif
static_assert(QLINK_FRAMES_SHUTDOWN_SPINS >= 1u, "the flag is read every N >= 1 empty polls");

#define QLINK_FRAMES_LINE_BYTES 64u
#define QLINK_FRAMES_LEN_AT 8u
#define QLINK_FRAMES_RX_FRAME_AT 14u
#define QLINK_FRAMES_TX_FRAME_AT 18u
#define QLINK_FRAMES_RX_CONSUMED_AT 16u
#define QLINK_FRAMES_TX_TAKEN_AT 24u
#define QLINK_FRAMES_STATE_AT 64u
// PSN pair, counters, the last frame's turnaround (ns, %globaltimer: seen -> published/dropped)
#define QLINK_FRAMES_STATE_WORDS (2u + QLINK_ROCE_COUNTERS)

// qlink_frame_ctx (the device context, 128 bytes) is declared in roce_frames.cuh, where the
// host's tests check its layout against openqlink.gpu.frames.

struct qlink_frames_session {
    qlink_frame_ctx ctx;
    volatile int* shutdown_flag;
    uint64_t seq;        // rx frames taken
    uint64_t tx_seq;     // tx frames published
    uint64_t tx_taken;   // the host's tx_taken as last read
    uint32_t next_slot;  // the rx slot polled next
    uint32_t tx_slot;    // the tx slot written next
    uint32_t mask;       // the lanes that attached
    uint32_t lanes;
    uint32_t rank;       // this lane's rank among them (0: the leader)
    uint32_t rank_lane[4];
    uint32_t stopping;   // the shutdown flag was seen
    uint64_t t_seen;     // %globaltimer when the current frame was seen
};
static_assert(sizeof(qlink_frames_session) <= CUDAQ_DEV_TRANSPORT_SESSION_BYTES,
              "session fits the kernel's storage");

static __shared__ __align__(16) uint32_t qlink_frames_crc[QLINK_CRC32_TABLE_WORDS];
static __shared__ __align__(16) uint64_t qlink_frames_state[QLINK_FRAMES_STATE_WORDS];
#if QLINK_FRAMES_SMEM_BYTES > 0
static __shared__ __align__(16) uint8_t qlink_frames_rx_smem[QLINK_FRAMES_SMEM_BYTES];
static __shared__ __align__(16) uint8_t qlink_frames_tx_smem[QLINK_FRAMES_SMEM_BYTES];
#endif

static __device__ __forceinline__ qlink_roce_psn* qlink_frames_psn() {
    return reinterpret_cast<qlink_roce_psn*>(&qlink_frames_state[0]);
}
static __device__ __forceinline__ uint64_t* qlink_frames_counters() {
    return &qlink_frames_state[1];
}

// The bridge's only inline PTX. A CPU model of the bridge (the host's tests run its hooks on a
// thread over plain memory) defines QLINK_FRAMES_CPU_MODEL and its own versions.
#ifndef QLINK_FRAMES_CPU_MODEL
static __device__ __forceinline__ void qlink_frames_store_v4(void* p, uint4 v) {
    asm volatile("st.relaxed.sys.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
static __device__ __forceinline__ void qlink_frames_store_u64(void* p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ uint32_t qlink_frames_lane_id() {
    uint32_t lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}
#endif

// The PSN state, the counters and the frame's turnaround into the control block, the lanes side
// by side.
static __device__ __forceinline__ void qlink_frames_write_state(qlink_frames_session* s) {
    if (s->rank == 0) {
        qlink_frames_state[QLINK_FRAMES_STATE_WORDS - 1] = qlink_globaltimer_ns() - s->t_seen;
    }
    __syncwarp(s->mask);  // the leader's updates of the shared state
    for (uint32_t i = s->rank; i < QLINK_FRAMES_STATE_WORDS; i += s->lanes) {
        qlink_frames_store_u64(s->ctx.control + QLINK_FRAMES_STATE_AT + 8u * i,
                               qlink_frames_state[i]);
    }
}

// Build the SEND_ONLY frame around the `payload_len` bytes at tx_stage + 18 + 54 and publish it
// as the next tx frame (waiting for room in the tx ring).
static __device__ void qlink_frames_send(qlink_frames_session* s, uint32_t payload_len) {
    __syncwarp(s->mask);  // what any lane wrote into the payload
    uint8_t* stage = s->ctx.tx_stage;
    uint32_t n = 0;
    if (s->rank == 0) {
        n = qlink_roce_build_send_only(qlink_frames_crc, &s->ctx.ep, qlink_frames_psn(),
                                       qlink_frames_counters(), stage + QLINK_FRAMES_TX_FRAME_AT,
                                       payload_len);
        *reinterpret_cast<uint32_t*>(stage + QLINK_FRAMES_LEN_AT) = n;
    }
    n = __shfl_sync(s->mask, n, s->rank_lane[0]);
    const uint64_t seq = s->tx_seq + 1;
    // Room: tx frame `seq` may overwrite the slot once the host has read frame seq - num_frames.
    uint64_t taken = s->tx_taken;
    if (seq - 1u - taken >= s->ctx.num_frames) {
        if (s->rank == 0) {
            const volatile uint64_t* word = reinterpret_cast<const volatile uint64_t*>(
                s->ctx.control + QLINK_FRAMES_TX_TAKEN_AT);
            do {
                taken = qlink_load_acquire_sys(word);
            } while (seq - 1u - taken >= s->ctx.num_frames);
        }
        taken = __shfl_sync(s->mask, taken, s->rank_lane[0]);
    }
    s->tx_taken = taken;
    uint8_t* dst = s->ctx.tx_ring + static_cast<uint64_t>(s->tx_slot) * s->ctx.tx_stride;
    const uint32_t end = (QLINK_FRAMES_TX_FRAME_AT + n + 15u) & ~15u;
    __syncwarp(s->mask);  // the leader's frame in the stage
    for (uint32_t off = 16u * s->rank; off < end; off += 16u * s->lanes) {
        uint4 v = *reinterpret_cast<const uint4*>(stage + off);
        if (off == 0) v.x = v.y = 0u;  // the sequence word: stored last
        qlink_frames_store_v4(dst + off, v);
    }
    // Every lane's stores, then the leader's fence and word: a release of all of them.
    __syncwarp(s->mask);
    if (s->rank == 0) {
        __threadfence_system();
        *reinterpret_cast<volatile uint64_t*>(dst) = seq;
    }
    s->tx_seq = seq;
    s->tx_slot = s->tx_slot + 1 == s->ctx.num_frames ? 0 : s->tx_slot + 1;
}

extern "C" __device__ void* cudaq_dev_transport_attach(void* storage, void* ctx,
                                                       volatile int* shutdown_flag) {
    if (storage == nullptr || ctx == nullptr) return nullptr;
    qlink_frames_session* s = static_cast<qlink_frames_session*>(storage);
    s->ctx = *static_cast<const qlink_frame_ctx*>(ctx);
    const qlink_frame_ctx& c = s->ctx;
    if (c.num_frames == 0 || c.rx_stride % QLINK_FRAMES_LINE_BYTES != 0 ||
        c.tx_stride % QLINK_FRAMES_LINE_BYTES != 0 ||
        c.rx_stride < QLINK_FRAMES_RX_FRAME_AT + c.rx_frame_bytes ||
        c.tx_stride < QLINK_FRAMES_TX_FRAME_AT + c.tx_frame_bytes ||
        c.tx_frame_bytes < QLINK_MIN_FRAME_BYTES || c.ep.slot_size < QLINK_RPC_HEADER_BYTES ||
        c.tx_frame_bytes < qlink_roce_send_only_bytes(c.ep.slot_size)) {
        return nullptr;
    }
#if QLINK_FRAMES_SMEM_BYTES > 0
    if (c.rx_stride <= QLINK_FRAMES_SMEM_BYTES) s->ctx.rx_stage = qlink_frames_rx_smem;
    if (c.tx_stride <= QLINK_FRAMES_SMEM_BYTES) s->ctx.tx_stage = qlink_frames_tx_smem;
#endif
    const uint32_t lane = qlink_frames_lane_id();
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
    s->seq = s->tx_seq = s->tx_taken = 0;
    s->next_slot = s->tx_slot = 0;
    s->stopping = 0;
    // The CRC tables (table 0 first: the others are built from it) and the state the host
    // handed over (PSNs, counters).
    qlink_crc32_table0_fill(qlink_frames_crc, s->rank, s->lanes);
    __syncwarp(mask);
    qlink_crc32_tables_fill_rest(qlink_frames_crc, s->rank, s->lanes);
    for (uint32_t i = s->rank; i < QLINK_FRAMES_STATE_WORDS - 1; i += s->lanes) {
        qlink_frames_state[i] = *reinterpret_cast<const volatile uint64_t*>(
            c.control + QLINK_FRAMES_STATE_AT + 8u * i);
    }
    __syncwarp(mask);
    return s;
}

// Wait for rx frame s->seq + 1 and stage it; false: shut down (nothing posted before the flag).
static __device__ bool qlink_frames_take(qlink_frames_session* s, uint32_t* out_len) {
    const uint32_t slot = s->next_slot;
    const uint64_t want = s->seq + 1;
    const uint32_t mask = s->mask;
    const uint32_t leader = s->rank_lane[0];
    const uint32_t rank = s->rank;
    const uint8_t* src = s->ctx.rx_ring + static_cast<uint64_t>(slot) * s->ctx.rx_stride;
    uint8_t* stage = s->ctx.rx_stage;
    uint32_t spins = 0;
    uint32_t len = 0;
    uint32_t from = 0;  // staged bytes so far
    if (s->lanes >= 4) {
        // One 64-byte read per poll: ranks 0..3 load the line's four 16-byte parts together.
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        for (;;) {
            __syncwarp(mask);
            if (rank < 4) v = qlink_load_acquire_sys_v4(src + 16u * rank);
            const uint64_t seq = __shfl_sync(
                mask, (static_cast<uint64_t>(v.y) << 32) | static_cast<uint64_t>(v.x), leader);
            if (seq == want) break;
            if (s->stopping) return false;  // looked again after the flag
            if (++spins >= QLINK_FRAMES_SHUTDOWN_SPINS) {
                spins = 0;
                int stop = 0;
                if (rank == 0) stop = qlink_load_acquire_sys_s32(s->shutdown_flag);
                s->stopping = static_cast<uint32_t>(__shfl_sync(mask, stop, leader) != 0);
            }
        }
        s->t_seen = qlink_globaltimer_ns();
        if (rank < 4) reinterpret_cast<uint4*>(stage)[rank] = v;
        len = __shfl_sync(mask, v.z, leader);  // slot bytes 8..11
        from = QLINK_FRAMES_LINE_BYTES;
    } else {
        int stop = 0;
        if (rank == 0) {
            const volatile uint64_t* word = reinterpret_cast<const volatile uint64_t*>(src);
            while (qlink_load_acquire_sys(word) != want) {
                if (s->stopping) {
                    stop = 1;
                    break;
                }
                if (++spins >= QLINK_FRAMES_SHUTDOWN_SPINS) {
                    spins = 0;
                    s->stopping = static_cast<uint32_t>(
                        qlink_load_acquire_sys_s32(s->shutdown_flag) != 0);
                }
            }
            if (!stop) len = *reinterpret_cast<const volatile uint32_t*>(src + QLINK_FRAMES_LEN_AT);
        }
        if (__shfl_sync(mask, stop, leader) != 0) return false;
        s->t_seen = qlink_globaltimer_ns();
        len = __shfl_sync(mask, len, leader);
    }
    if (len > s->ctx.rx_frame_bytes) len = s->ctx.rx_frame_bytes;
    const uint32_t end = (QLINK_FRAMES_RX_FRAME_AT + len + 15u) & ~15u;
    // The rest of the slot: after the leader's acquire (bar.warp.sync orders it for every lane).
    __syncwarp(mask);
    for (uint32_t off = from + 16u * rank; off < end; off += 16u * s->lanes) {
        *reinterpret_cast<uint4*>(stage + off) = qlink_load_relaxed_sys_v4(src + off);
    }
    __syncwarp(mask);
    // The slot's bytes are all here: the host may reuse it.
    if (rank == 0) {
        *reinterpret_cast<volatile uint64_t*>(s->ctx.control + QLINK_FRAMES_RX_CONSUMED_AT) = want;
    }
    s->seq = want;
    s->next_slot = slot + 1 == s->ctx.num_frames ? 0 : slot + 1;
    *out_len = len;
    return true;
}

extern "C" __device__ cudaq_rx_dev_status_t cudaq_dev_rx_poll(void* session, void** out_request,
                                                              void** out_response) {
    qlink_frames_session* s = static_cast<qlink_frames_session*>(session);
    const uint32_t mask = s->mask;
    const uint32_t leader = s->rank_lane[0];
    uint8_t* frame = s->ctx.rx_stage + QLINK_FRAMES_RX_FRAME_AT;
    uint8_t* response = s->ctx.tx_stage + QLINK_FRAMES_TX_FRAME_AT + QLINK_ROCE_HEADERS_BYTES;
    for (;;) {
        uint32_t len = 0;
        if (!qlink_frames_take(s, &len)) return CUDAQ_RX_DEV_SHUTDOWN;
        uint32_t why = 0;
        uint32_t offset = 0;
        uint32_t length = 0;
        if (s->rank == 0) {
            qlink_roce_request req;
            why = qlink_roce_check_request(qlink_frames_crc, &s->ctx.ep, qlink_frames_psn(),
                                           qlink_frames_counters(), frame, len, &req);
            if (why == QLINK_RX_ROCE_ACCEPTED) {
                offset = req.offset;
                length = req.length;
                uint8_t* rpc = frame + offset;
                if (length < QLINK_RPC_HEADER_BYTES) {
                    // Shorter than its header: answered here, -3, the header read zero-padded.
                    uint8_t head[QLINK_RPC_HEADER_BYTES];
                    for (uint32_t i = 0; i < QLINK_RPC_HEADER_BYTES; ++i) {
                        head[i] = i < length ? rpc[i] : 0u;
                    }
                    qlink_rpc_response r;
                    r.magic = QLINK_RPC_RESPONSE_MAGIC;
                    r.status = QLINK_STATUS_TRUNCATED;
                    r.result_len = 0;
                    r.request_id = static_cast<uint32_t>(head[12]) |
                                   (static_cast<uint32_t>(head[13]) << 8) |
                                   (static_cast<uint32_t>(head[14]) << 16) |
                                   (static_cast<uint32_t>(head[15]) << 24);
                    uint64_t ts = 0;
                    for (int i = 7; i >= 0; --i) ts = (ts << 8) | head[16 + i];
                    r.ptp_timestamp = ts;
                    *reinterpret_cast<qlink_rpc_response*>(response) = r;
                } else {
                    // rpc is 8-byte aligned (slot byte 14 + 74): read the header's words.
                    qlink_rpc_header* h = reinterpret_cast<qlink_rpc_header*>(rpc);
                    if (h->arg_len > length - QLINK_RPC_HEADER_BYTES) h->arg_len = 0xFFFFFFFFu;
                }
            }
        }
        why = __shfl_sync(mask, why, leader);
        if (why == QLINK_RX_ROCE_ACCEPTED) {
            offset = __shfl_sync(mask, offset, leader);
            length = __shfl_sync(mask, length, leader);
            if (length >= QLINK_RPC_HEADER_BYTES) {
                __syncwarp(mask);  // the leader's arg_len fix
                *out_request = frame + offset;
                *out_response = response;
                return CUDAQ_RX_DEV_READY;
            }
            qlink_frames_send(s, QLINK_RPC_HEADER_BYTES);
        }
        qlink_frames_write_state(s);  // a dropped frame's count, or the bridge's own answer
    }
}

extern "C" __device__ void cudaq_dev_tx_publish(void* session, void* response) {
    qlink_frames_session* s = static_cast<qlink_frames_session*>(session);
    __syncwarp(s->mask);  // what any calling lane wrote into the response frame
    const uint32_t result_len = static_cast<const qlink_rpc_response*>(response)->result_len;
    const uint32_t room = s->ctx.ep.slot_size - QLINK_RPC_HEADER_BYTES;
    qlink_frames_send(s, QLINK_RPC_HEADER_BYTES + min(result_len, room));
    qlink_frames_write_state(s);
}
