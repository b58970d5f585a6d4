// openqlink unified dispatch: the declarations shared by the dispatch kernel, the transport
// bridges and the DEVICE_CALL handlers. Compiled by NVRTC (no standard headers: the fixed-width
// integer types are declared here, as glibc declares them on LP64 Linux).
//
// Ref: cuda-quantum realtime/docs/cudaq_realtime_message_protocol.md (RPCHeader, RPCResponse);
// realtime/include/cudaq/realtime/cudaq_realtime.h (cudaq_function_entry_t,
// cudaq_handler_schema_t, cudaq_dispatch_mode_t);
// realtime/include/cudaq/realtime/daemon/dispatcher/unified_device_transport.cuh (hooks).
#ifndef OPENQLINK_DISPATCH_CUH
#define OPENQLINK_DISPATCH_CUH

#ifndef OPENQLINK_NO_STDINT_TYPEDEFS
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
#endif

// ---- RPC wire format (little-endian, 24-byte headers) ----
#define QLINK_RPC_REQUEST_MAGIC 0x43555152u   // "CUQR"
#define QLINK_RPC_RESPONSE_MAGIC 0x43555153u  // "CUQS"
#define QLINK_RPC_HEADER_BYTES 24u

struct qlink_rpc_header {
    uint32_t magic;
    uint32_t function_id;
    uint32_t arg_len;
    uint32_t request_id;
    uint64_t ptp_timestamp;
};

struct qlink_rpc_response {
    uint32_t magic;
    int32_t status;
    uint32_t result_len;
    uint32_t request_id;
    uint64_t ptp_timestamp;
};

// Response status (openqlink.dispatch: STATUS_*).
#define QLINK_STATUS_OK 0
#define QLINK_STATUS_HANDLER_ERROR 1
#define QLINK_STATUS_UNKNOWN_FUNCTION (-1)
#define QLINK_STATUS_BAD_ARG_LEN (-2)
#define QLINK_STATUS_TRUNCATED (-3)

// ---- Function table (CUDA-Q's cudaq_function_entry_t layout, 168 bytes) ----
#define QLINK_DEVICE_CALL 0
#define QLINK_GRAPH_LAUNCH 1
#define QLINK_HOST_CALL 2
#define QLINK_MAX_ARGS 8
#define QLINK_MAX_RESULTS 4

struct qlink_type_desc {
    uint8_t type_id;
    uint8_t reserved[3];
    uint32_t size_bytes;
    uint32_t num_elements;
};

struct qlink_handler_schema {
    uint8_t num_args;
    uint8_t num_results;
    uint16_t reserved;
    qlink_type_desc args[QLINK_MAX_ARGS];
    qlink_type_desc results[QLINK_MAX_RESULTS];
};

struct qlink_function_entry {
    union {
        void* device_fn_ptr;
        void* graph_exec;
        void* host_fn;
    } handler;
    uint32_t function_id;
    uint8_t dispatch_mode;
    uint8_t reserved[3];
    qlink_handler_schema schema;
};

static_assert(sizeof(qlink_rpc_header) == 24, "RPCHeader is 24 bytes");
static_assert(sizeof(qlink_rpc_response) == 24, "RPCResponse is 24 bytes");
static_assert(sizeof(qlink_type_desc) == 12, "cudaq_type_desc_t is 12 bytes");
static_assert(sizeof(qlink_handler_schema) == 148, "cudaq_handler_schema_t is 148 bytes");
static_assert(sizeof(qlink_function_entry) == 168, "function entry is 168 bytes");

// A DEVICE_CALL handler: reads arg_len bytes at `in`, writes at most max_result_len bytes at
// `out` (the built-in kernel's private output area, 16-byte aligned, which it copies into the
// response after its 24-byte header), stores how many it wrote in *result_len and returns the
// response status (0 ok, > 0 handler error).
typedef int (*qlink_device_rpc_fn)(const void* in, void* out, uint32_t arg_len,
                                   uint32_t max_result_len, uint32_t* result_len);

// ---- Unified transport hooks, supplied by the bridge as separate LTO-IR ----
// CUDA-Q calls them from one thread. openqlink's hooks may also be called by several lanes of
// one warp together (the built-in kernel runs one warp): every lane active at attach calls
// every hook, converged, and gets the same session state and frames back; the bridge may use
// those lanes for one coalesced access (the loopback bridge reads a request's first 64-byte
// line in one load of four lanes). One thread alone is always valid.
#define CUDAQ_DEV_TRANSPORT_SESSION_BYTES 256
#define CUDAQ_DEV_TRANSPORT_SESSION_ALIGN 16

enum cudaq_rx_dev_status_t { CUDAQ_RX_DEV_READY = 0, CUDAQ_RX_DEV_SHUTDOWN = 1 };

// Called once at kernel entry; returns the session (inside `storage`) or NULL to exit.
extern "C" __device__ void* cudaq_dev_transport_attach(void* storage, void* ctx,
                                                       volatile int* shutdown_flag);
// Blocks until a request is ready (READY: *out_request, *out_response set) or shutdown.
// openqlink's bridges return SHUTDOWN only when no request posted before the shutdown flag was
// set is left: once they see the flag they look at the next request once more and hand it out
// if it is there, so every request posted before the host stops the kernel is answered.
// Frames are at least 8-byte aligned (the loopback bridge's: header at 8 mod 16, so the
// arguments and the result start 16-byte aligned).
extern "C" __device__ cudaq_rx_dev_status_t cudaq_dev_rx_poll(void* session, void** out_request,
                                                              void** out_response);
// Publishes the response of the request last handed out and frees its slot; called exactly
// once per request handed out, also for undispatchable ones. What the calling lanes wrote into
// the response frame before the call is published (the hook synchronises them first).
extern "C" __device__ void cudaq_dev_tx_publish(void* session, void* response);

// ---- Handler call, generated per link by openqlink.gpu (direct calls or the table pointer) ----
// Calls `entry`'s handler: a direct call for a handler linked into the module (with
// inline_handlers, a switch on the entry's function_id), else through its device_fn_ptr.
extern "C" __device__ int qlink_call_handler(const qlink_function_entry* entry, const void* in,
                                             void* out, uint32_t arg_len,
                                             uint32_t max_result_len, uint32_t* result_len);
// The same with the entry's function_id given (it must equal entry->function_id): the switch
// reads a register, not the entry.
extern "C" __device__ int qlink_call_handler_id(uint32_t function_id,
                                                const qlink_function_entry* entry,
                                                const void* in, void* out, uint32_t arg_len,
                                                uint32_t max_result_len, uint32_t* result_len);

// ---- Helpers ----
static __device__ __forceinline__ uint64_t qlink_globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Load with acquire semantics at system scope (sees what the CPU wrote before it).
static __device__ __forceinline__ uint64_t qlink_load_acquire_sys(const volatile uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// A 32-bit flag with acquire semantics at system scope (what the host stored before it is seen
// by the loads that follow).
static __device__ __forceinline__ int qlink_load_acquire_sys_s32(const volatile int* p) {
    int v;
    asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// 16 bytes with acquire semantics at system scope (one lane's part of a coalesced line read).
static __device__ __forceinline__ uint4 qlink_load_acquire_sys_v4(const void* p) {
    uint4 v;
    asm volatile("ld.acquire.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

// 16 bytes, strong (relaxed) at system scope: never served from a stale L1 line.
static __device__ __forceinline__ uint4 qlink_load_relaxed_sys_v4(const void* p) {
    uint4 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

#endif  // OPENQLINK_DISPATCH_CUH
