/*
 * The C side of cbf's DPDK transport (src/net/dpdk.rs, cargo feature `dpdk`).
 *
 * DPDK's fast-path calls (rte_eth_rx_burst, rte_eth_tx_burst, rte_pktmbuf_*) are static inline
 * functions in its headers, so Rust cannot link to them: this file wraps each in a plain
 * function, and does port set-up (one RX queue, a TX queue per sender, a mempool of whole-frame
 * mbufs) in three calls (configure, pool, start: the pool is sized between the first two from the
 * descriptor counts the device allows), so that the Rust side sees a handful of entry points with
 * fixed-size structs.
 * Nothing here parses a frame or decides policy: that is src/net/frame.rs and src/net/dpdk.rs.
 *
 * Errors are returned as negative errno values (DPDK's convention); cbf_dpdk_strerror names
 * them.
 */
#include <rte_config.h> /* first: the other headers depend on its definitions */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* Mirrors DpdkPortConf in src/net/dpdk/ffi.rs. */
struct cbf_dpdk_port_conf {
    uint16_t rx_desc;   /* RX descriptors (adjusted to the device's limits) */
    uint16_t tx_desc;   /* TX descriptors (likewise) */
    uint32_t mbufs;     /* mbufs in the port's pool */
    uint16_t data_room; /* bytes of frame per mbuf (whole frames: no scatter) */
    uint16_t mtu;       /* requested MTU, clamped to the device's maximum */
    uint16_t tx_queues; /* TX queues: one per sender of the process on this port */
    uint16_t cache;     /* mbufs in each lcore's cache of the pool */
};

/* Mirrors DpdkPortInfo in src/net/dpdk/ffi.rs. */
struct cbf_dpdk_port_info {
    uint8_t mac[6];
    uint8_t ip_cksum_offload; /* the NIC checks IPv4 header checksums (flags in ol_flags) */
    uint8_t udp_cksum_offload;
    uint16_t mtu;
    uint16_t rx_desc; /* RX descriptors, as the device's limits adjusted them */
    uint16_t tx_desc; /* TX descriptors, likewise */
    uint16_t _pad;
    uint32_t pool_size; /* mbufs in the port's pool (created, or found by name) */
    int32_t socket; /* the device's NUMA node (rte_eth_dev_socket_id), -1 when unknown */
    char driver[32];
};

/* Mirrors RxFrame in src/net/dpdk/ffi.rs: one received mbuf's first segment. */
struct cbf_dpdk_frame {
    const uint8_t *data;
    uint32_t data_len; /* bytes in this segment */
    uint32_t pkt_len;  /* bytes in the whole frame (more when the PMD scattered it) */
    uint32_t ip_bad;   /* the NIC found the IPv4 header checksum bad */
    uint32_t l4_bad;   /* the NIC found the UDP checksum bad */
    uint32_t l4_good;  /* the NIC verified the UDP checksum */
    uint32_t _pad;
};

/* Mirrors DpdkStats in src/net/dpdk/ffi.rs (rte_eth_stats, the counters cbf reports). */
struct cbf_dpdk_stats {
    uint64_t ipackets;
    uint64_t opackets;
    uint64_t imissed;   /* dropped by the NIC: RX queue full */
    uint64_t ierrors;   /* erroneous frames */
    uint64_t oerrors;
    uint64_t rx_nombuf; /* no mbuf to receive into */
};

int cbf_dpdk_eal_init(int argc, char **argv)
{
    int r = rte_eal_init(argc, argv);
    return r < 0 ? -rte_errno : r;
}

const char *cbf_dpdk_strerror(int err)
{
    return rte_strerror(err < 0 ? -err : err);
}

uint16_t cbf_dpdk_port_count(void)
{
    return rte_eth_dev_count_avail();
}

int cbf_dpdk_port_by_name(const char *name, uint16_t *port)
{
    return rte_eth_dev_get_port_by_name(name, port);
}

/* The most TX queues the port's driver allows (net_af_packet: its qpairs; net_ring: 16). */
int cbf_dpdk_port_max_tx(uint16_t port, uint16_t *max)
{
    struct rte_eth_dev_info dev;
    int r = rte_eth_dev_info_get(port, &dev);

    if (r < 0)
        return r;
    *max = dev.max_tx_queues;
    return 0;
}

/* The NUMA node to allocate the port's memory on: the device's, else the caller's. */
static int port_socket(uint16_t port)
{
    int socket = rte_eth_dev_socket_id(port);

    return socket < 0 ? (int)rte_socket_id() : socket;
}

/*
 * Configure `port` with one RX queue and c->tx_queues TX queues (offloads, MTU), and adjust the
 * descriptor counts to the device's limits: info->rx_desc and info->tx_desc are what the queues
 * will get, so that the caller can size the pool from them (src/net/dpdk/eal.rs).
 */
int cbf_dpdk_port_configure(uint16_t port, const struct cbf_dpdk_port_conf *c,
                            struct cbf_dpdk_port_info *info)
{
    struct rte_eth_dev_info dev;
    struct rte_eth_conf conf;
    uint16_t rx_desc = c->rx_desc, tx_desc = c->tx_desc;
    int r;

    if (!rte_eth_dev_is_valid_port(port))
        return -ENODEV;
    if (c->tx_queues == 0)
        return -EINVAL;
    r = rte_eth_dev_info_get(port, &dev);
    if (r < 0)
        return r;

    memset(&conf, 0, sizeof(conf));
    memset(info, 0, sizeof(*info));
    info->socket = rte_eth_dev_socket_id(port);
    if (dev.rx_offload_capa & RTE_ETH_RX_OFFLOAD_IPV4_CKSUM) {
        conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_IPV4_CKSUM;
        info->ip_cksum_offload = 1;
    }
    if (dev.rx_offload_capa & RTE_ETH_RX_OFFLOAD_UDP_CKSUM) {
        conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
        info->udp_cksum_offload = 1;
    }
    /* The largest MTU the device allows: its max_mtu and its largest frame (af_packet says
     * 1518 yet copies whole frames of up to its framesz, so the clamp costs nothing there). */
    conf.rxmode.mtu = c->mtu;
    if (conf.rxmode.mtu > dev.max_mtu)
        conf.rxmode.mtu = dev.max_mtu;
    if (dev.max_rx_pktlen > RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN &&
        conf.rxmode.mtu > dev.max_rx_pktlen - RTE_ETHER_HDR_LEN - RTE_ETHER_CRC_LEN)
        conf.rxmode.mtu = dev.max_rx_pktlen - RTE_ETHER_HDR_LEN - RTE_ETHER_CRC_LEN;
    if (conf.rxmode.mtu < dev.min_mtu)
        conf.rxmode.mtu = dev.min_mtu;
    info->mtu = (uint16_t)conf.rxmode.mtu;

    r = rte_eth_dev_configure(port, 1, c->tx_queues, &conf);
    if (r < 0)
        return r;
    r = rte_eth_dev_adjust_nb_rx_tx_desc(port, &rx_desc, &tx_desc);
    if (r < 0)
        return r;
    info->rx_desc = rx_desc;
    info->tx_desc = tx_desc;
    snprintf(info->driver, sizeof(info->driver), "%s", dev.driver_name ? dev.driver_name : "");
    return 0;
}

/* The port's mempool of c->mbufs whole-frame mbufs (found by name if this process made it
 * already); info->pool_size is how many it holds. */
int cbf_dpdk_port_pool(uint16_t port, const struct cbf_dpdk_port_conf *c,
                       struct cbf_dpdk_port_info *info, struct rte_mempool **pool)
{
    char name[RTE_MEMPOOL_NAMESIZE];

    snprintf(name, sizeof(name), "cbf_pool_%u", (unsigned)port);
    *pool = rte_mempool_lookup(name);
    if (*pool == NULL)
        *pool = rte_pktmbuf_pool_create(name, c->mbufs, c->cache, 0,
                                        (uint16_t)(c->data_room + RTE_PKTMBUF_HEADROOM),
                                        port_socket(port));
    if (*pool == NULL)
        return -rte_errno;
    info->pool_size = (*pool)->size;
    return 0;
}

/* Set up the configured port's queues with info's descriptor counts, RX from `pool`, and
 * start it; info->mac is its address. */
int cbf_dpdk_port_start(uint16_t port, const struct cbf_dpdk_port_conf *c,
                        struct cbf_dpdk_port_info *info, struct rte_mempool *pool)
{
    struct rte_ether_addr mac;
    unsigned socket = (unsigned)port_socket(port);
    uint16_t q;
    int r;

    r = rte_eth_rx_queue_setup(port, 0, info->rx_desc, socket, NULL, pool);
    if (r < 0)
        return r;
    for (q = 0; q < c->tx_queues; q++) {
        r = rte_eth_tx_queue_setup(port, q, info->tx_desc, socket, NULL);
        if (r < 0)
            return r;
    }
    r = rte_eth_dev_start(port);
    if (r < 0)
        return r;
    r = rte_eth_macaddr_get(port, &mac);
    if (r < 0)
        return r;
    memcpy(info->mac, mac.addr_bytes, 6);
    return 0;
}

/*
 * Let the groups' MACs in: a multicast filter list where the PMD has one, else all multicast.
 * Returns 1 when the list was set, 0 when all multicast is let in, or a negative errno.
 */
int cbf_dpdk_join(uint16_t port, const uint8_t (*macs)[6], uint32_t n)
{
    struct rte_ether_addr list[512];
    uint32_t i;
    int r;

    if (n > 0 && n <= 512) {
        for (i = 0; i < n; i++)
            memcpy(list[i].addr_bytes, macs[i], 6);
        r = rte_eth_dev_set_mc_addr_list(port, list, n);
        if (r == 0)
            return 1;
    }
    r = rte_eth_allmulticast_enable(port);
    /* Virtual ports (ring, null) filter nothing and say so: every frame arrives anyway. */
    return (r == 0 || r == -ENOTSUP) ? 0 : r;
}

uint16_t cbf_dpdk_rx(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs,
                     struct cbf_dpdk_frame *frames, uint16_t n)
{
    uint16_t got = rte_eth_rx_burst(port, queue, mbufs, n);
    uint16_t i;

    for (i = 0; i < got; i++) {
        const struct rte_mbuf *m = mbufs[i];
        uint64_t l4 = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
        frames[i].data = rte_pktmbuf_mtod(m, const uint8_t *);
        frames[i].data_len = m->data_len;
        frames[i].pkt_len = m->pkt_len;
        frames[i].ip_bad = (m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK) == RTE_MBUF_F_RX_IP_CKSUM_BAD;
        frames[i].l4_bad = l4 == RTE_MBUF_F_RX_L4_CKSUM_BAD;
        frames[i].l4_good = l4 == RTE_MBUF_F_RX_L4_CKSUM_GOOD;
    }
    return got;
}

void cbf_dpdk_free(struct rte_mbuf **mbufs, uint16_t n)
{
    rte_pktmbuf_free_bulk(mbufs, n);
}

/* Free mbufs that a receive batch held, given back as the integer handles the Rust side keeps
 * them under (src/net/dpdk/recv.rs), in bulk. */
void cbf_dpdk_free_handles(const uintptr_t *handles, size_t n)
{
    struct rte_mbuf *m[64];

    while (n > 0) {
        size_t k = n < 64 ? n : 64, i;

        for (i = 0; i < k; i++)
            m[i] = (struct rte_mbuf *)handles[i];
        rte_pktmbuf_free_bulk(m, (unsigned)k);
        handles += k;
        n -= k;
    }
}

/* mbufs free in `pool` (its common store and every lcore's cache). */
unsigned cbf_dpdk_pool_avail(const struct rte_mempool *pool)
{
    return rte_mempool_avail_count(pool);
}

struct span {
    const uint8_t *p;
    size_t n;
    int inside;
};

static void span_in_chunk(struct rte_mempool *mp, void *opaque, struct rte_mempool_memhdr *h,
                          unsigned idx)
{
    struct span *s = opaque;
    const uint8_t *lo = h->addr;

    (void)mp;
    (void)idx;
    if (s->p >= lo && s->n <= h->len && s->p - lo <= (ptrdiff_t)(h->len - s->n))
        s->inside = 1;
}

/* Whether the n bytes at p lie in one of `pool`'s memory chunks (where its mbufs are). */
int cbf_dpdk_pool_contains(struct rte_mempool *pool, const uint8_t *p, size_t n)
{
    struct span s = {p, n, 0};

    rte_mempool_mem_iter(pool, span_in_chunk, &s);
    return s.inside;
}

int cbf_dpdk_alloc(struct rte_mempool *pool, struct rte_mbuf **mbufs, uint16_t n)
{
    return rte_pktmbuf_alloc_bulk(pool, mbufs, n);
}

/* Make a fresh mbuf hold `len` bytes; the pointer to write them at, or NULL if they do not fit. */
uint8_t *cbf_dpdk_fill(struct rte_mbuf *m, uint16_t len)
{
    return (uint8_t *)rte_pktmbuf_append(m, len);
}

uint16_t cbf_dpdk_tx(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs, uint16_t n)
{
    return rte_eth_tx_burst(port, queue, mbufs, n);
}

int cbf_dpdk_stats(uint16_t port, struct cbf_dpdk_stats *out)
{
    struct rte_eth_stats s;
    int r = rte_eth_stats_get(port, &s);

    if (r < 0)
        return r;
    out->ipackets = s.ipackets;
    out->opackets = s.opackets;
    out->imissed = s.imissed;
    out->ierrors = s.ierrors;
    out->oerrors = s.oerrors;
    out->rx_nombuf = s.rx_nombuf;
    return 0;
}
