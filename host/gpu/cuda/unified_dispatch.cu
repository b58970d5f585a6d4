// openqlink unified dispatch kernel: one persistent warp that receives, dispatches and answers.
//
// Launched <<<1, 32>>> (one warp; <<<1, 1>>>, CUDA-Q's single thread, works too; other warps and
// blocks exit at once). Loop: rx_poll -> look the function_id up in the device function table
// -> call the DEVICE_CALL handler -> ALWAYS write the RPCResponse (CUQS, status, result_len,
// echoed request_id and ptp_timestamp) -> tx_publish, until the transport reports shutdown.
// Status: 0 ok, > 0 the handler's error, -1 bad magic or unknown function_id (or an entry that
// is not DEVICE_CALL), -2 arg_len differs from the entry's schema, -3 arg_len larger than a slot
// can hold (max_arg_len). A handler whose result_len exceeds max_result_len gets status 1 and an
// empty result.
//
// A handler writes its result into a private output area, not into the response frame: the
// kernel's dynamic shared memory (qlink_handler_out, %dynamic_smem_size bytes, given by the
// launch: max_result_len rounded up to 16 plus a guard), which the hardware places after every
// static shared variable (the function table copy, the bridge's staging buffers). The lanes then
// copy result_len bytes (at most max_result_len) into the response. A handler that writes past
// max_result_len therefore cannot reach the table or the kernel's state: what lands in the guard
// is dropped, and a write past the end of the block's shared memory faults the kernel instead.
// A launch with less dynamic shared memory than max_result_len gives the handlers only what it
// gave (max_result_len is lowered to it).
//
// The lanes of the warp call the transport hooks together (openqlink_dispatch.cuh), so a bridge
// can use them for coalesced accesses; the handler call and the response header are one lane's
// alone (the caller's), so a handler runs on one thread as in CUDA-Q. When the table has no more
// entries than the warp has lanes, each lane holds one entry's function_id, argument bytes and
// validity in registers: the lookup is one ballot, and the lane whose entry matched is the
// caller, so nothing moves between lanes before the call; the checks are selects and the
// handler is called by a switch on the request's function_id (inline_handlers). With no entry
// for the request, or a larger table, the leader (the lowest lane) answers, searching the table.
// The first QLINK_SHARED_TABLE_ENTRIES (default 32) entries are also copied into shared memory
// at start, with each entry's argument bytes precomputed from its schema (the handler call reads
// its entry there); a larger table is searched in global memory. After the call a ballot tells
// the lanes whether there is a result (an empty one costs no divergent branch) and a shuffle
// its length.
//
// Ref: cuda-quantum realtime/lib/daemon/dispatcher/unified_dispatch_kernel.cu (CUDA-Q's unified
// kernel: the same loop and response rules); cudaq_realtime_message_protocol.md.
#include "openqlink_dispatch.cuh"

#ifndef QLINK_SHARED_TABLE_ENTRIES
#define QLINK_SHARED_TABLE_ENTRIES 32
#endif

static __device__ __forceinline__ uint32_t qlink_schema_arg_bytes(const qlink_handler_schema& s) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < s.num_args && i < QLINK_MAX_ARGS; ++i) n += s.args[i].size_bytes;
    return n;
}

static __shared__ qlink_function_entry qlink_shared_table[QLINK_SHARED_TABLE_ENTRIES];
static __shared__ uint32_t qlink_shared_arg_bytes[QLINK_SHARED_TABLE_ENTRIES];
// The handlers' private output area: dynamic shared memory, after all static shared memory.
extern __shared__ __align__(16) uint8_t qlink_handler_out[];

static __device__ __forceinline__ uint32_t qlink_lane_id() {
    uint32_t lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

// transport_ctx: device-accessible bridge context; table/count: device function table;
// max_arg_len: slot payload capacity (slot_size - 24); max_result_len: handler output capacity;
// shutdown_flag: set to 1 by the host to stop; processed: requests answered so far (updated
// after each response); timing_ns/timing_capacity: optional ring of in-kernel turnarounds (ns
// from rx_poll's return to tx_publish's return, %globaltimer), NULL for none.
extern "C" __global__ void qlink_unified_dispatch(void* transport_ctx,
                                                  const qlink_function_entry* table,
                                                  uint32_t count, uint32_t max_arg_len,
                                                  uint32_t max_result_len,
                                                  volatile int* shutdown_flag,
                                                  volatile uint64_t* processed,
                                                  uint64_t* timing_ns, uint32_t timing_capacity) {
    if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0 || threadIdx.x >= 32 ||
        threadIdx.y != 0 || threadIdx.z != 0) {
        return;  // one warp serves
    }
    const uint32_t mask = __activemask();
    const uint32_t lanes = __popc(mask);
    const uint32_t below = mask & ((1u << qlink_lane_id()) - 1u);  // the lanes below this one
    const uint32_t rank = __popc(below);
    const uint32_t leader = static_cast<uint32_t>(__ffs(mask) - 1);
    uint32_t out_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(out_bytes));
    if (max_result_len > out_bytes) max_result_len = out_bytes;  // the area bounds the result
    __align__(CUDAQ_DEV_TRANSPORT_SESSION_ALIGN) unsigned char
        storage[CUDAQ_DEV_TRANSPORT_SESSION_BYTES];
    void* session = cudaq_dev_transport_attach(storage, transport_ctx, shutdown_flag);
    if (session == nullptr) return;
    const bool shared = count <= QLINK_SHARED_TABLE_ENTRIES;
    if (shared) {
        for (uint32_t i = rank; i < count; i += lanes) {
            qlink_shared_table[i] = table[i];
            qlink_shared_arg_bytes[i] = qlink_schema_arg_bytes(table[i].schema);
        }
    }
    // Entry `rank` in this lane's registers when the whole table fits the lanes: its
    // function_id, whether it is a DEVICE_CALL with a handler, and its argument bytes.
    const bool in_registers = count <= lanes;
    bool my_valid = false;
    uint32_t my_function_id = 0;
    uint32_t my_arg_bytes = 0;
    uint32_t my_callable = 0;
    if (in_registers && rank < count) {
        my_valid = true;
        my_function_id = table[rank].function_id;
        my_arg_bytes = qlink_schema_arg_bytes(table[rank].schema);
        my_callable = table[rank].dispatch_mode == QLINK_DEVICE_CALL &&
                      table[rank].handler.device_fn_ptr != nullptr ? 1u : 0u;
    }
    __syncwarp(mask);
    if (shared) table = qlink_shared_table;
    uint64_t done = 0;
    uint32_t timing_slot = 0;
    for (;;) {
        void* request = nullptr;
        void* response = nullptr;
        if (cudaq_dev_rx_poll(session, &request, &response) != CUDAQ_RX_DEV_READY) break;
        const uint64_t t0 = timing_ns != nullptr ? qlink_globaltimer_ns() : 0;
        const qlink_rpc_header* h = static_cast<const qlink_rpc_header*>(request);
        qlink_rpc_response* r = static_cast<qlink_rpc_response*>(response);
        // The whole header at once, three independent 8-byte loads (frames are 8-byte aligned).
        const uint64_t* hw = static_cast<const uint64_t*>(request);
        const uint64_t head0 = hw[0];  // magic, function_id
        const uint64_t head1 = hw[1];  // arg_len, request_id
        const uint64_t ptp_timestamp = hw[2];
        const uint32_t magic = static_cast<uint32_t>(head0);
        const uint32_t function_id = static_cast<uint32_t>(head0 >> 32);
        const uint32_t arg_len = static_cast<uint32_t>(head1);
        // Lookup: the first entry with this function_id. The lane that answers (the caller) is
        // the one that holds that entry when the table is in the lanes' registers (one ballot,
        // nothing moves between lanes before the call), else the leader, which searches the
        // table; with no such entry, the leader answers with an error status.
        const qlink_function_entry* entry = nullptr;
        uint32_t want = 0;
        uint32_t callable = 0;
        bool caller;
        uint32_t caller_lane;
        if (in_registers) {
            const bool match = my_valid && my_function_id == function_id;
            const uint32_t hit = __ballot_sync(mask, match);
            caller = hit != 0 ? match && (hit & below) == 0 : rank == 0;
            caller_lane = hit != 0 ? static_cast<uint32_t>(__ffs(hit) - 1) : leader;
            entry = &table[rank];
            want = my_arg_bytes;
            callable = match ? my_callable : 0u;  // 0 on the leader when no entry matched
        } else {
            caller = rank == 0;
            caller_lane = leader;
            if (caller) {
                uint32_t i = 0;
                while (i < count && table[i].function_id != function_id) ++i;
                if (i < count) {
                    entry = &table[i];
                    callable = entry->dispatch_mode == QLINK_DEVICE_CALL &&
                               entry->handler.device_fn_ptr != nullptr ? 1u : 0u;
                    want = shared ? qlink_shared_arg_bytes[i]
                                  : qlink_schema_arg_bytes(entry->schema);
                }
            }
        }
        uint32_t result_len = 0;  // the caller's
        if (caller) {
            // The checks as selects, one branch to the handler (`callable` is false where no
            // entry matched: the leader answering alone).
            int32_t status = arg_len > max_arg_len ? QLINK_STATUS_TRUNCATED
                             : arg_len != want     ? QLINK_STATUS_BAD_ARG_LEN
                                                   : QLINK_STATUS_OK;
            if (magic != QLINK_RPC_REQUEST_MAGIC || !callable) {
                status = QLINK_STATUS_UNKNOWN_FUNCTION;
            }
            if (status == QLINK_STATUS_OK) {
                status = qlink_call_handler_id(function_id, entry, h + 1, qlink_handler_out,
                                               arg_len, max_result_len, &result_len);
                if (result_len > max_result_len) {
                    status = QLINK_STATUS_HANDLER_ERROR;
                    result_len = 0;
                }
            }
            // The response header in three 8-byte stores (frames are 8-byte aligned).
            uint64_t* w = reinterpret_cast<uint64_t*>(r);
            w[0] = QLINK_RPC_RESPONSE_MAGIC |
                   (static_cast<uint64_t>(static_cast<uint32_t>(status)) << 32);
            w[1] = result_len | (head1 & 0xFFFFFFFF00000000ull);  // request_id echoed
            w[2] = ptp_timestamp;
        }
        // The result (result_len <= max_result_len bytes of the handler's area) into the
        // response: 8-byte words side by side over the lanes (frames are 8-byte aligned, the
        // result starts 24 bytes in), the last bytes by the leader; never more than result_len.
        // Whether there is one is a ballot (a value the compiler knows all lanes share, so an
        // empty result costs no divergent branch); its length is shuffled from the caller.
        // tx_publish's __syncwarp makes every lane's stores part of the response.
        if (__ballot_sync(mask, result_len != 0) != 0) {
            const uint32_t n = __shfl_sync(mask, result_len, caller_lane);
            __syncwarp(mask);  // the caller's handler wrote the area
            uint64_t* dst = reinterpret_cast<uint64_t*>(r + 1);
            const uint64_t* src = reinterpret_cast<const uint64_t*>(qlink_handler_out);
            for (uint32_t i = rank; i < n / 8u; i += lanes) dst[i] = src[i];
            if (rank == 0 && (n & 7u) != 0) {
                for (uint32_t i = n & ~7u; i < n; ++i) {
                    reinterpret_cast<uint8_t*>(r + 1)[i] = qlink_handler_out[i];
                }
            }
        }
        cudaq_dev_tx_publish(session, response);
        ++done;
        if (rank == 0) {
            *processed = done;
            if (timing_ns != nullptr && timing_capacity != 0) {
                timing_ns[timing_slot] = qlink_globaltimer_ns() - t0;
                if (++timing_slot == timing_capacity) timing_slot = 0;
            }
        }
    }
    if (rank == 0) {
        *processed = done;
        __threadfence_system();
    }
}
