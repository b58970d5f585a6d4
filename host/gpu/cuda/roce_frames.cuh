// openqlink RoCEv2 frames in plain C++: CRC-32 / ICRC, the IPv4 header checksum, the checks of
// an RPC request frame (UC RDMA_WRITE_ONLY_WITH_IMMEDIATE) and the build of the UC SEND_ONLY
// response frame, as the host's openqlink.roce.UCQueuePair does them.
//
// One source for two compilers: every function is QLINK_FRAMES_FN, `__device__` under NVRTC /
// nvcc and nothing under a host compiler, and uses no CUDA-only construct (no intrinsics, no
// shared memory, no standard library), so the GPU frame bridge (roce_frame_bridge.cu) and the
// host's tests (g++ into a shared library, through ctypes) run the same code. Under NVRTC the
// fixed-width types come from openqlink_dispatch.cuh (include it first); under a host compiler
// from <stdint.h>.
//
// Frames run from the destination MAC through the Ethernet padding (no FCS). Multi-byte fields
// of every header are big-endian on the wire.
//
// Ref: IEEE 802.3 3.2 (Ethernet II); RFC 791 3.1 (IPv4), RFC 1071 / RFC 1624 (checksums);
// RFC 768, RFC 1122 4.1.3.4 (UDP checksum 0: not computed); IBTA Vol 1 Release 1.4 9.2 (BTH),
// 9.3.2 (RETH), 9.3.4 (ImmDt), 9.8.3 (UC: an ONLY packet resynchronises the PSN), 10.9.1.2
// (P_Key match), 7.8.1 + Annex A17.4.4 (ICRC: CRC-32 over the masked invariant fields, least
// significant byte first on the wire); zlib crc32 (the polynomial 0xEDB88320, reflected).
#ifndef OPENQLINK_ROCE_FRAMES_CUH
#define OPENQLINK_ROCE_FRAMES_CUH

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define QLINK_FRAMES_FN static __device__ inline
#else
#include <stdint.h>
#define QLINK_FRAMES_FN static inline
#endif

// ---- Header sizes and offsets (IPv4 without options) ----
#define QLINK_ETH_BYTES 14u
#define QLINK_IP_BYTES 20u
#define QLINK_UDP_BYTES 8u
#define QLINK_BTH_AT 42u              // Ethernet + IPv4 + UDP
#define QLINK_ROCE_HEADERS_BYTES 54u  // ... + BTH (12)
#define QLINK_RETH_BYTES 16u
#define QLINK_IMMDT_BYTES 4u
#define QLINK_ICRC_BYTES 4u
#define QLINK_MIN_FRAME_BYTES 60u
#define QLINK_ROCEV2_PORT 4791u
#define QLINK_OP_SEND_ONLY 0x24u
#define QLINK_OP_RDMA_WRITE_ONLY_WITH_IMMEDIATE 0x2Bu
#define QLINK_CRC32_TABLE_WORDS (8u * 256u)  // slice-by-8 tables

// ---- Counters: the order of openqlink.roce.RX_COUNTER_NAMES ----
enum qlink_roce_counter {
    QLINK_RX_FRAMES = 0, QLINK_RX_ROCE_ACCEPTED, QLINK_RX_PUBLISHED, QLINK_TX_FRAMES,
    QLINK_DROP_ETH, QLINK_DROP_IP, QLINK_DROP_UDP, QLINK_DROP_ICRC, QLINK_DROP_OPCODE,
    QLINK_DROP_PKEY, QLINK_DROP_QPN, QLINK_DROP_RKEY, QLINK_DROP_VA, QLINK_DROP_LENGTH,
    QLINK_DROP_PSN, QLINK_PSN_GAP, QLINK_DROP_PEER, QLINK_DROP_OVERFLOW,
    QLINK_ROCE_COUNTERS  // 18
};

// The QP contract of the endpoint (64 bytes; openqlink.gpu.frames.FrameEndpointConfig packs it).
// Addresses and numbers are plain integers (host byte order), MACs 48-bit values.
struct qlink_roce_endpoint {
    uint64_t host_mac;      // our MAC: destination accepted, source sent
    uint64_t qsc_mac;       // the peer's MAC: source accepted, destination sent
    uint64_t ring_va;       // VA of slot 0 of the request ring (RETH VA base)
    uint32_t host_ip;       // our IPv4 address
    uint32_t qsc_ip;        // the peer's
    uint32_t host_qpn;      // 24-bit DestQP accepted
    uint32_t qsc_qpn;       // 24-bit DestQP sent
    uint32_t ring_rkey;     // R_Key of the request ring
    uint32_t num_slots;     // request ring slots (1..4096: ImmDt[11:0])
    uint32_t slot_size;     // bytes per request slot
    uint32_t pmtu_bytes;    // path MTU: most payload bytes per packet
    uint16_t p_key;         // P_Key sent and matched
    uint16_t udp_src_port;  // UDP source port sent
    uint32_t reserved;
};

// The PSN state of the QP (IBTA 9.7.1): the PSN of the next packet sent, the PSN expected next.
struct qlink_roce_psn {
    uint32_t tx_psn;
    uint32_t rx_epsn;
};

// An accepted request: its RPC bytes are frame[offset, offset + length), for ring slot `slot`.
struct qlink_roce_request {
    uint32_t offset;
    uint32_t length;
    uint32_t slot;
    uint32_t psn;
    uint32_t psn_gap;  // an ONLY packet whose PSN was not the expected one (accepted)
};

// The frame bridge's device context (roce_frame_bridge.cu; in device memory, 128 bytes), packed
// by openqlink.gpu.frames.FrameRings.ctx_bytes.
struct qlink_frame_ctx {
    qlink_roce_endpoint ep;   // the QP contract
    uint8_t* rx_ring;         // request frames, mapped pinned, device pointer
    uint8_t* tx_ring;         // response frames
    uint8_t* control;         // the control block
    uint8_t* rx_stage;        // device memory, rx_stride bytes (slots too large for smem)
    uint8_t* tx_stage;        // device memory, tx_stride bytes
    uint32_t num_frames;      // slots per frame ring
    uint32_t rx_stride;       // bytes per rx slot (multiple of 64)
    uint32_t tx_stride;       // bytes per tx slot (multiple of 64)
    uint32_t rx_frame_bytes;  // largest request frame a slot holds
    uint32_t tx_frame_bytes;  // largest response frame a slot holds
    uint32_t reserved;
};

#if defined(__cplusplus) && __cplusplus >= 201103L
static_assert(sizeof(qlink_frame_ctx) == 128, "qlink_frame_ctx is shared with Python");
static_assert(sizeof(qlink_roce_endpoint) == 64, "qlink_roce_endpoint is shared with Python");
static_assert(sizeof(qlink_roce_psn) == 8, "qlink_roce_psn is shared with Python");
#endif

// ---- Byte order ----
QLINK_FRAMES_FN uint32_t qlink_be16(const uint8_t* p) {
    return (static_cast<uint32_t>(p[0]) << 8) | p[1];
}
QLINK_FRAMES_FN uint32_t qlink_be24(const uint8_t* p) {
    return (static_cast<uint32_t>(p[0]) << 16) | (static_cast<uint32_t>(p[1]) << 8) | p[2];
}
QLINK_FRAMES_FN uint32_t qlink_be32(const uint8_t* p) {
    return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
           (static_cast<uint32_t>(p[2]) << 8) | p[3];
}
QLINK_FRAMES_FN uint64_t qlink_be48(const uint8_t* p) {
    return (static_cast<uint64_t>(qlink_be16(p)) << 32) | qlink_be32(p + 2);
}
QLINK_FRAMES_FN uint64_t qlink_be64(const uint8_t* p) {
    return (static_cast<uint64_t>(qlink_be32(p)) << 32) | qlink_be32(p + 4);
}
QLINK_FRAMES_FN void qlink_put_be16(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 8);
    p[1] = static_cast<uint8_t>(v);
}
QLINK_FRAMES_FN void qlink_put_be32(uint8_t* p, uint32_t v) {
    qlink_put_be16(p, v >> 16);
    qlink_put_be16(p + 2, v);
}
QLINK_FRAMES_FN void qlink_put_be48(uint8_t* p, uint64_t v) {
    qlink_put_be16(p, static_cast<uint32_t>(v >> 32));
    qlink_put_be32(p + 2, static_cast<uint32_t>(v));
}

// ---- CRC-32 (zlib's: reflected polynomial 0xEDB88320, initial and final inversion) ----

// Fill words [first, QLINK_CRC32_TABLE_WORDS) of the slice-by-8 tables, every `step`-th (several
// threads may share the work: thread i of n passes first = i, step = n). Table k, entry b is the
// CRC of byte b followed by k zero bytes. Entries of table k > 0 depend on table k - 1: fill
// table 0 first (all threads), then the rest (qlink_crc32_tables_fill_rest).
QLINK_FRAMES_FN void qlink_crc32_table0_fill(uint32_t* table, uint32_t first, uint32_t step) {
    for (uint32_t b = first; b < 256u; b += step) {
        uint32_t c = b;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        table[b] = c;
    }
}
QLINK_FRAMES_FN void qlink_crc32_tables_fill_rest(uint32_t* table, uint32_t first,
                                                  uint32_t step) {
    // Column b of tables 1..7 in one thread: each entry needs the one above it.
    for (uint32_t b = first; b < 256u; b += step) {
        uint32_t c = table[b];
        for (uint32_t k = 1; k < 8u; ++k) {
            c = (c >> 8) ^ table[c & 0xFFu];
            table[256u * k + b] = c;
        }
    }
}
QLINK_FRAMES_FN void qlink_crc32_tables_init(uint32_t* table) {
    qlink_crc32_table0_fill(table, 0, 1);
    qlink_crc32_tables_fill_rest(table, 0, 1);
}

// The running CRC register (not inverted) over n more bytes, 8 at a time (slice-by-8).
QLINK_FRAMES_FN uint32_t qlink_crc32_run(const uint32_t* t, uint32_t c, const uint8_t* p,
                                         uint32_t n) {
    while (n >= 8u) {
        const uint32_t lo = c ^ (static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                                 (static_cast<uint32_t>(p[2]) << 16) |
                                 (static_cast<uint32_t>(p[3]) << 24));
        c = t[7u * 256u + (lo & 0xFFu)] ^ t[6u * 256u + ((lo >> 8) & 0xFFu)] ^
            t[5u * 256u + ((lo >> 16) & 0xFFu)] ^ t[4u * 256u + (lo >> 24)] ^
            t[3u * 256u + p[4]] ^ t[2u * 256u + p[5]] ^ t[1u * 256u + p[6]] ^ t[p[7]];
        p += 8;
        n -= 8u;
    }
    while (n--) c = (c >> 8) ^ t[(c ^ *p++) & 0xFFu];
    return c;
}

// zlib.crc32(data, prev): the CRC-32 of n bytes continuing from `prev` (0 to start).
QLINK_FRAMES_FN uint32_t qlink_crc32(const uint32_t* t, uint32_t prev, const uint8_t* p,
                                     uint32_t n) {
    return ~qlink_crc32_run(t, ~prev, p, n);
}

// The RoCEv2 ICRC (IBTA 7.8.1, Annex A17.4.4) of a packet from the first byte of its IPv4 header
// through its last pad byte (`n` bytes, at least the 40 bytes of IPv4 + UDP + BTH): the CRC-32
// of 8 bytes of ones (the masked LRH), then the IPv4, UDP and BTH headers with TOS, TTL, the
// IPv4 checksum, the UDP checksum and BTH byte 4 (FECN, BECN, resv6) set to ones, then the rest.
// Sent least significant byte first (as openqlink.wire.roce.icrc).
QLINK_FRAMES_FN uint32_t qlink_icrc(const uint32_t* t, const uint8_t* ip, uint32_t n) {
    uint8_t head[48];
    for (uint32_t i = 0; i < 8u; ++i) head[i] = 0xFFu;
    for (uint32_t i = 0; i < 40u; ++i) head[8u + i] = ip[i];
    head[8 + 1] = 0xFFu;                    // TOS
    head[8 + 8] = 0xFFu;                    // TTL
    head[8 + 10] = head[8 + 11] = 0xFFu;    // IPv4 header checksum
    head[8 + 26] = head[8 + 27] = 0xFFu;    // UDP checksum
    head[8 + 32] = 0xFFu;                   // BTH FECN, BECN, resv6
    uint32_t c = qlink_crc32_run(t, 0xFFFFFFFFu, head, 48u);
    return ~qlink_crc32_run(t, c, ip + 40, n - 40u);
}

// ---- RFC 1071 one's-complement sums ----

// The sum of n bytes as 16-bit big-endian words (an odd byte padded with zero), unfolded.
QLINK_FRAMES_FN uint32_t qlink_ones_sum(uint32_t acc, const uint8_t* p, uint32_t n) {
    uint32_t i = 0;
    for (; i + 1u < n; i += 2u) acc += qlink_be16(p + i);
    if (i < n) acc += static_cast<uint32_t>(p[i]) << 8;
    return acc;
}
QLINK_FRAMES_FN uint32_t qlink_ones_fold(uint32_t acc) {
    while (acc >> 16) acc = (acc & 0xFFFFu) + (acc >> 16);
    return acc;
}
// The checksum to store in an IPv4 header (its checksum field zero).
QLINK_FRAMES_FN uint32_t qlink_ipv4_checksum(const uint8_t* ip) {
    return ~qlink_ones_fold(qlink_ones_sum(0, ip, QLINK_IP_BYTES)) & 0xFFFFu;
}
// Whether an IPv4 header's checksum verifies (a one's-complement zero, either form: RFC 1624 3).
QLINK_FRAMES_FN int qlink_ipv4_header_ok(const uint8_t* ip) {
    const uint32_t s = qlink_ones_fold(qlink_ones_sum(0, ip, QLINK_IP_BYTES));
    return s == 0u || s == 0xFFFFu;
}
// Whether a UDP datagram's (non-zero) checksum verifies over the pseudo-header (RFC 768).
QLINK_FRAMES_FN int qlink_udp_checksum_ok(uint32_t src_ip, uint32_t dst_ip, const uint8_t* udp,
                                          uint32_t udp_len) {
    uint32_t acc = (src_ip >> 16) + (src_ip & 0xFFFFu) + (dst_ip >> 16) + (dst_ip & 0xFFFFu) +
                   17u + udp_len;
    return qlink_ones_fold(qlink_ones_sum(acc, udp, udp_len)) == 0xFFFFu;
}

// ---- Receive: one RPC request frame ----

// The drop reason of a frame too short for the RoCEv2 headers (n < 54): the layer at which it
// stops being one, as openqlink.wire.packet.parse_frame would fail on it.
QLINK_FRAMES_FN uint32_t qlink_roce_short_reason(const uint8_t* f, uint32_t n) {
    if (n < QLINK_ETH_BYTES || qlink_be16(f + 12) != 0x0800u) return QLINK_DROP_ETH;
    if (n < QLINK_ETH_BYTES + QLINK_IP_BYTES) return QLINK_DROP_IP;
    const uint8_t* ip = f + QLINK_ETH_BYTES;
    const uint32_t total = qlink_be16(ip + 2);
    if ((ip[0] >> 4) != 4u || (ip[0] & 15u) != 5u || total < QLINK_IP_BYTES ||
        total > n - QLINK_ETH_BYTES || ip[9] != 17u || (qlink_be16(ip + 6) & 0x3FFFu) != 0u) {
        return QLINK_DROP_IP;
    }
    if (total < QLINK_IP_BYTES + QLINK_UDP_BYTES) return QLINK_DROP_UDP;
    const uint32_t udp_len = qlink_be16(ip + 24);
    if (udp_len < QLINK_UDP_BYTES || QLINK_IP_BYTES + udp_len > total ||
        qlink_be16(ip + 22) != QLINK_ROCEV2_PORT) {
        return QLINK_DROP_UDP;
    }
    return QLINK_DROP_LENGTH;
}

// Check frame f (n bytes) as UCQueuePair.handle_frame checks an RDMA_WRITE_ONLY_WITH_IMMEDIATE,
// in its order, and count it: RX_FRAMES always, then the drop reason, or RX_ROCE_ACCEPTED,
// RX_PUBLISHED (and PSN_GAP when the PSN was not the expected one: accepted, IBTA 9.8.3).
// Returns QLINK_RX_ROCE_ACCEPTED (and fills *req, advances psn->rx_epsn) or the DROP_* index.
// The endpoint serves RPC requests only: every other opcode, other RDMA WRITEs included, is
// DROP_OPCODE here (the host steers those to its own QP). A slot still in use (DROP_OVERFLOW)
// cannot happen: each request is answered before the next frame is taken.
QLINK_FRAMES_FN uint32_t qlink_roce_check_request(const uint32_t* crc_table,
                                                  const qlink_roce_endpoint* ep,
                                                  qlink_roce_psn* psn_state, uint64_t* counters,
                                                  const uint8_t* f, uint32_t n,
                                                  qlink_roce_request* req) {
    counters[QLINK_RX_FRAMES] += 1u;
    uint32_t why = QLINK_RX_ROCE_ACCEPTED;
    do {
        if (n < QLINK_ROCE_HEADERS_BYTES) {
            why = qlink_roce_short_reason(f, n);
            break;
        }
        const uint8_t* ip = f + QLINK_ETH_BYTES;
        if (qlink_be48(f) != ep->host_mac || qlink_be16(f + 12) != 0x0800u) {
            why = QLINK_DROP_ETH;
            break;
        }
        const uint32_t total = qlink_be16(ip + 2);
        const uint32_t src_ip = qlink_be32(ip + 12);
        const uint32_t dst_ip = qlink_be32(ip + 16);
        if (ip[0] != 0x45u || total < QLINK_IP_BYTES || QLINK_ETH_BYTES + total > n ||
            (qlink_be16(ip + 6) & 0x3FFFu) != 0u || dst_ip != ep->host_ip || ip[9] != 17u ||
            !qlink_ipv4_header_ok(ip)) {
            why = QLINK_DROP_IP;
            break;
        }
        const uint8_t* udp = ip + QLINK_IP_BYTES;
        const uint32_t udp_len = qlink_be16(udp + 4);
        if (udp_len < QLINK_UDP_BYTES || QLINK_IP_BYTES + udp_len > total ||
            qlink_be16(udp + 2) != QLINK_ROCEV2_PORT ||
            (qlink_be16(udp + 6) != 0u && !qlink_udp_checksum_ok(src_ip, dst_ip, udp, udp_len))) {
            why = QLINK_DROP_UDP;
            break;
        }
        const uint32_t udp_end = QLINK_ETH_BYTES + QLINK_IP_BYTES + udp_len;
        const uint32_t icrc_at = udp_end - QLINK_ICRC_BYTES;
        if (udp_end < QLINK_ICRC_BYTES + QLINK_ROCE_HEADERS_BYTES) {
            why = QLINK_DROP_LENGTH;
            break;
        }
        const uint32_t icrc = qlink_icrc(crc_table, ip, icrc_at - QLINK_ETH_BYTES);
        const uint8_t* got = f + icrc_at;
        if (got[0] != (icrc & 0xFFu) || got[1] != ((icrc >> 8) & 0xFFu) ||
            got[2] != ((icrc >> 16) & 0xFFu) || got[3] != (icrc >> 24)) {
            why = QLINK_DROP_ICRC;
            break;
        }
        const uint8_t* bth = f + QLINK_BTH_AT;
        if (bth[0] != QLINK_OP_RDMA_WRITE_ONLY_WITH_IMMEDIATE || (bth[1] & 15u) != 0u) {
            why = QLINK_DROP_OPCODE;
            break;
        }
        const uint32_t p_key = qlink_be16(bth + 2);
        if ((p_key & 0x7FFFu) != (ep->p_key & 0x7FFFu) || ((p_key | ep->p_key) & 0x8000u) == 0u) {
            why = QLINK_DROP_PKEY;
            break;
        }
        if (qlink_be24(bth + 5) != ep->host_qpn) {
            why = QLINK_DROP_QPN;
            break;
        }
        if (qlink_be48(f + 6) != ep->qsc_mac || src_ip != ep->qsc_ip) {
            why = QLINK_DROP_PEER;
            break;
        }
        uint32_t at = QLINK_ROCE_HEADERS_BYTES;
        if (at + QLINK_RETH_BYTES + QLINK_IMMDT_BYTES > icrc_at) {
            why = QLINK_DROP_LENGTH;
            break;
        }
        const uint64_t va = qlink_be64(f + at);
        const uint32_t r_key = qlink_be32(f + at + 8);
        const uint32_t dma_len = qlink_be32(f + at + 12);
        const uint32_t imm = qlink_be32(f + at + 16);
        at += QLINK_RETH_BYTES + QLINK_IMMDT_BYTES;
        const uint32_t pad = (bth[1] >> 4) & 3u;
        if (pad > icrc_at - at) {
            why = QLINK_DROP_LENGTH;
            break;
        }
        const uint32_t len = icrc_at - pad - at;
        const uint32_t psn = qlink_be24(bth + 9);
        if (r_key != ep->ring_rkey) {
            why = QLINK_DROP_RKEY;
            break;
        }
        const uint64_t ring_bytes =
            static_cast<uint64_t>(ep->num_slots) * static_cast<uint64_t>(ep->slot_size);
        const uint64_t offset = va - ep->ring_va;
        if (va < ep->ring_va || offset > ring_bytes || dma_len > ring_bytes - offset) {
            why = QLINK_DROP_VA;
            break;
        }
        if (len != dma_len || len > ep->pmtu_bytes) {
            why = QLINK_DROP_LENGTH;
            break;
        }
        const uint32_t slot = imm & 0xFFFu;
        if (slot >= ep->num_slots ||
            offset != static_cast<uint64_t>(slot) * static_cast<uint64_t>(ep->slot_size) ||
            len > ep->slot_size) {
            why = QLINK_DROP_VA;
            break;
        }
        if (len == 0u) {
            why = QLINK_DROP_LENGTH;  // no request to publish
            break;
        }
        req->offset = at;
        req->length = len;
        req->slot = slot;
        req->psn = psn;
        req->psn_gap = psn != psn_state->rx_epsn ? 1u : 0u;
        if (req->psn_gap) counters[QLINK_PSN_GAP] += 1u;
        psn_state->rx_epsn = (psn + 1u) & 0xFFFFFFu;
        counters[QLINK_RX_PUBLISHED] += 1u;
    } while (0);
    counters[why] += 1u;
    return why;
}

// ---- Send: the SEND_ONLY response frame ----

// Bytes of the SEND_ONLY frame of a `payload_len`-byte payload (pad, ICRC, Ethernet padding).
QLINK_FRAMES_FN uint32_t qlink_roce_send_only_bytes(uint32_t payload_len) {
    const uint32_t n = QLINK_ROCE_HEADERS_BYTES + ((payload_len + 3u) & ~3u) + QLINK_ICRC_BYTES;
    return n < QLINK_MIN_FRAME_BYTES ? QLINK_MIN_FRAME_BYTES : n;
}

// Write the UC SEND_ONLY frame carrying the `payload_len` bytes already at out[54...] (the
// payload is built in place: the RPC response goes there first) into `out`, with PSN
// psn_state->tx_psn (then advanced, mod 2^24); counts TX_FRAMES. Byte for byte what
// UCQueuePair.send_frame builds: Ethernet (to the peer's MAC, from ours, IPv4), IPv4 (no
// options, TOS 0, identification 0, DF, TTL 64, UDP, our address to the peer's, checksum), UDP
// (our source port, 4791, checksum 0), BTH (SEND_ONLY, SE 0, M 0, PadCnt, TVer 0, P_Key, the
// peer's QPN, A 0, PSN), payload, PadCnt zero bytes, ICRC, zeros to 60 bytes. Returns the
// frame's length (qlink_roce_send_only_bytes).
QLINK_FRAMES_FN uint32_t qlink_roce_build_send_only(const uint32_t* crc_table,
                                                    const qlink_roce_endpoint* ep,
                                                    qlink_roce_psn* psn_state, uint64_t* counters,
                                                    uint8_t* out, uint32_t payload_len) {
    const uint32_t pad = (0u - payload_len) & 3u;
    const uint32_t udp_len = QLINK_UDP_BYTES + 12u + payload_len + pad + QLINK_ICRC_BYTES;
    qlink_put_be48(out, ep->qsc_mac);
    qlink_put_be48(out + 6, ep->host_mac);
    qlink_put_be16(out + 12, 0x0800u);
    uint8_t* ip = out + QLINK_ETH_BYTES;
    ip[0] = 0x45u;
    ip[1] = 0u;
    qlink_put_be16(ip + 2, QLINK_IP_BYTES + udp_len);
    qlink_put_be16(ip + 4, 0u);
    qlink_put_be16(ip + 6, 0x4000u);  // DF
    ip[8] = 64u;
    ip[9] = 17u;
    qlink_put_be16(ip + 10, 0u);
    qlink_put_be32(ip + 12, ep->host_ip);
    qlink_put_be32(ip + 16, ep->qsc_ip);
    qlink_put_be16(ip + 10, qlink_ipv4_checksum(ip));
    uint8_t* udp = ip + QLINK_IP_BYTES;
    qlink_put_be16(udp, ep->udp_src_port);
    qlink_put_be16(udp + 2, QLINK_ROCEV2_PORT);
    qlink_put_be16(udp + 4, udp_len);
    qlink_put_be16(udp + 6, 0u);
    uint8_t* bth = out + QLINK_BTH_AT;
    const uint32_t psn = psn_state->tx_psn & 0xFFFFFFu;
    bth[0] = QLINK_OP_SEND_ONLY;
    bth[1] = static_cast<uint8_t>(pad << 4);
    qlink_put_be16(bth + 2, ep->p_key);
    qlink_put_be32(bth + 4, ep->qsc_qpn & 0xFFFFFFu);
    qlink_put_be32(bth + 8, psn);
    uint32_t end = QLINK_ROCE_HEADERS_BYTES + payload_len;
    for (uint32_t i = 0; i < pad; ++i) out[end++] = 0u;
    const uint32_t icrc = qlink_icrc(crc_table, ip, end - QLINK_ETH_BYTES);
    out[end++] = static_cast<uint8_t>(icrc);
    out[end++] = static_cast<uint8_t>(icrc >> 8);
    out[end++] = static_cast<uint8_t>(icrc >> 16);
    out[end++] = static_cast<uint8_t>(icrc >> 24);
    while (end < QLINK_MIN_FRAME_BYTES) out[end++] = 0u;
    psn_state->tx_psn = (psn + 1u) & 0xFFFFFFu;
    counters[QLINK_TX_FRAMES] += 1u;
    return end;
}

#endif  // OPENQLINK_ROCE_FRAMES_CUH
