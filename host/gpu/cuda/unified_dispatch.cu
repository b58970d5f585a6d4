// openqlink unified dispatch kernel: one persistent thread that receives, dispatches and answers.
//
// Launched <<<1, 1>>>. Loop: rx_poll -> look the function_id up in the device function table ->
// call the DEVICE_CALL handler -> ALWAYS write the RPCResponse (CUQS, status, result_len,
// echoed request_id and ptp_timestamp) -> tx_publish, until the transport reports shutdown.
// Status: 0 ok, > 0 the handler's error, -1 bad magic or unknown function_id (or an entry that
// is not DEVICE_CALL), -2 arg_len differs from the entry's schema, -3 arg_len larger than a slot
// can hold (max_arg_len). A handler whose result_len exceeds max_result_len gets status 1 and an
// empty result.
//
// The first QLINK_SHARED_TABLE_ENTRIES (default 32) table entries are copied into shared memory
// at start, with each entry's argument bytes precomputed from its schema, so a lookup costs no
// global-memory round trip (the acquire loads that poll the ring invalidate the L1 cache); a
// larger table is searched in global memory.
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
    __align__(CUDAQ_DEV_TRANSPORT_SESSION_ALIGN) unsigned char
        storage[CUDAQ_DEV_TRANSPORT_SESSION_BYTES];
    void* session = cudaq_dev_transport_attach(storage, transport_ctx, shutdown_flag);
    if (session == nullptr) return;
    const bool shared = count <= QLINK_SHARED_TABLE_ENTRIES;
    if (shared) {
        for (uint32_t i = 0; i < count; ++i) {
            qlink_shared_table[i] = table[i];
            qlink_shared_arg_bytes[i] = qlink_schema_arg_bytes(table[i].schema);
        }
        table = qlink_shared_table;
    }
    uint64_t done = 0;
    for (;;) {
        void* request = nullptr;
        void* response = nullptr;
        if (cudaq_dev_rx_poll(session, &request, &response) != CUDAQ_RX_DEV_READY) break;
        const uint64_t t0 = timing_ns != nullptr ? qlink_globaltimer_ns() : 0;
        const qlink_rpc_header* h = static_cast<const qlink_rpc_header*>(request);
        qlink_rpc_response* r = static_cast<qlink_rpc_response*>(response);
        int32_t status = QLINK_STATUS_UNKNOWN_FUNCTION;
        uint32_t result_len = 0;
        if (h->magic == QLINK_RPC_REQUEST_MAGIC) {
            const uint32_t function_id = h->function_id;
            uint32_t i = 0;
            while (i < count && table[i].function_id != function_id) ++i;
            const qlink_function_entry* e = i < count ? &table[i] : nullptr;
            if (e != nullptr && e->dispatch_mode == QLINK_DEVICE_CALL &&
                e->handler.device_fn_ptr != nullptr) {
                const uint32_t want = shared ? qlink_shared_arg_bytes[i]
                                             : qlink_schema_arg_bytes(e->schema);
                if (h->arg_len > max_arg_len) {
                    status = QLINK_STATUS_TRUNCATED;
                } else if (h->arg_len != want) {
                    status = QLINK_STATUS_BAD_ARG_LEN;
                } else {
                    status = qlink_call_handler(e, h + 1, r + 1, h->arg_len, max_result_len,
                                                &result_len);
                    if (result_len > max_result_len) {
                        status = QLINK_STATUS_HANDLER_ERROR;
                        result_len = 0;
                    }
                }
            }
        }
        // The response header in two stores (16 + 8 bytes; frames are 16-byte aligned).
        uint4 head;
        head.x = QLINK_RPC_RESPONSE_MAGIC;
        head.y = static_cast<uint32_t>(status);
        head.z = result_len;
        head.w = h->request_id;
        *reinterpret_cast<uint4*>(r) = head;
        r->ptp_timestamp = h->ptp_timestamp;
        cudaq_dev_tx_publish(session, response);
        ++done;
        *processed = done;
        if (timing_ns != nullptr && timing_capacity != 0) {
            timing_ns[(done - 1) % timing_capacity] = qlink_globaltimer_ns() - t0;
        }
    }
    *processed = done;
    __threadfence_system();
}
