/*
 * cbf's shim over the mlx5 direct-verbs calls of the multi-packet (striding) receive queue
 * (cargo feature `ibv`, built by build.rs with ibv_shim.c, linked with libmlx5). The `ibverbs`
 * crate binds neither libmlx5 nor the inline verbs a striding queue is made of (the extended
 * completion queue and its poll, work queues, indirection tables, ibv_create_qp_ex), so each
 * function here is one such call, or one fixed sequence of them; every choice (stride sizes,
 * queue depth, which buffer goes back when) is made in Rust (src/net/ibv/mprq_*.rs,
 * recv_mprq.rs).
 *
 * Receive requests are written into the work queue's ring here rather than posted with
 * ibv_post_wq_recv: libmlx5 lays a striding queue's entries out with a next-segment before the
 * data segment (struct mlx5_mprq_wqe) but its post routine writes the data segment at the
 * entry's start, so a striding entry has to be built by hand (spead2 does the same, for the
 * same reason). Only the receive thread that owns the queue calls these functions.
 */
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#include <endian.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* What the device says about striding receive queues, in cbf's own fixed layout (mirrored by
 * StridingCaps in src/net/ibv/mprq_verbs.rs, and checked against it by a test). */
struct cbf_mprq_caps {
    uint32_t striding;        /* 1: mlx5dv_query_device answered MLX5DV_CONTEXT_MASK_STRIDING_RQ */
    uint32_t mpw_allowed;     /* 1: MLX5DV_CONTEXT_FLAGS_MPW_ALLOWED */
    uint32_t min_stride_log;  /* log2 bytes per stride, least and most */
    uint32_t max_stride_log;
    uint32_t min_strides_log; /* log2 strides per work queue entry, least and most */
    uint32_t max_strides_log;
    uint32_t qp_types;        /* bit n: queue pair type n may use a striding queue */
    uint32_t max_cqe;         /* ibv_query_device: completion queue entries */
    uint32_t max_qp_wr;       /* ibv_query_device: work requests per queue */
};

/* One completion as Rust reads it: the raw byte count word (a striding queue packs the bytes,
 * the strides consumed and the filler flag into it) and the status (enum ibv_wc_status). */
struct cbf_stride_wc {
    uint32_t byte_cnt;
    uint32_t status;
};

/* A striding work queue and what it takes to write requests into its ring. */
struct cbf_mprq_wq {
    struct ibv_wq *wq;
    struct mlx5dv_rwq rwq;
    uint32_t head; /* requests written since creation */
};

/*
 * Fill `caps` for the device `ctx` is open on. Returns 0, EOPNOTSUPP for a device that is not
 * an mlx5 one (caps then zero), or the errno of the query that failed.
 */
int cbf_mprq_query(struct ibv_context *ctx, struct cbf_mprq_caps *caps)
{
    struct ibv_device_attr attr;
    struct mlx5dv_context dv;
    int err;

    memset(caps, 0, sizeof(*caps));
    if (!mlx5dv_is_supported(ctx->device))
        return EOPNOTSUPP;
    err = ibv_query_device(ctx, &attr);
    if (err)
        return err;
    caps->max_cqe = attr.max_cqe > 0 ? (uint32_t)attr.max_cqe : 0;
    caps->max_qp_wr = attr.max_qp_wr > 0 ? (uint32_t)attr.max_qp_wr : 0;
    memset(&dv, 0, sizeof(dv));
    dv.comp_mask = MLX5DV_CONTEXT_MASK_STRIDING_RQ;
    err = mlx5dv_query_device(ctx, &dv);
    if (err)
        return err;
    caps->striding = (dv.comp_mask & MLX5DV_CONTEXT_MASK_STRIDING_RQ) != 0;
    caps->mpw_allowed = (dv.flags & MLX5DV_CONTEXT_FLAGS_MPW_ALLOWED) != 0;
    caps->min_stride_log = dv.striding_rq_caps.min_single_stride_log_num_of_bytes;
    caps->max_stride_log = dv.striding_rq_caps.max_single_stride_log_num_of_bytes;
    caps->min_strides_log = dv.striding_rq_caps.min_single_wqe_log_num_of_strides;
    caps->max_strides_log = dv.striding_rq_caps.max_single_wqe_log_num_of_strides;
    caps->qp_types = dv.striding_rq_caps.supported_qpts;
    return 0;
}

/* An extended completion queue of `cqe` entries reporting byte counts, polled by one thread,
 * on `channel`'s `vector` (NULL: polled only). NULL with errno on failure. */
struct ibv_cq_ex *cbf_cqx_create(struct ibv_context *ctx, uint32_t cqe,
                                 struct ibv_comp_channel *channel, uint32_t vector)
{
    struct ibv_cq_init_attr_ex attr;

    memset(&attr, 0, sizeof(attr));
    attr.cqe = cqe;
    attr.channel = channel;
    attr.comp_vector = channel ? vector : 0;
    attr.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
    attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    attr.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
    return ibv_create_cq_ex(ctx, &attr);
}

/* The plain completion queue inside an extended one (to arm, wait on and destroy it). */
struct ibv_cq *cbf_cqx_cq(struct ibv_cq_ex *cq)
{
    return ibv_cq_ex_to_cq(cq);
}

/* Up to `max` completions into `out`: how many, or a negative errno. */
int cbf_cqx_poll(struct ibv_cq_ex *cq, int max, struct cbf_stride_wc *out)
{
    struct ibv_poll_cq_attr attr;
    int n = 0;
    int err;

    if (max <= 0)
        return 0;
    memset(&attr, 0, sizeof(attr));
    err = ibv_start_poll(cq, &attr);
    if (err == ENOENT)
        return 0;
    if (err)
        return -err;
    for (;;) {
        out[n].status = (uint32_t)cq->status;
        out[n].byte_cnt = ibv_wc_read_byte_len(cq);
        n++;
        if (n == max)
            break;
        err = ibv_next_poll(cq);
        if (err)
            break; /* ENOENT: drained; an error leaves the rest for the next poll */
    }
    ibv_end_poll(cq);
    return n;
}

/*
 * A striding receive work queue of at least `max_wr` entries of 2^strides_log strides of
 * 2^stride_log bytes, completing on `cq`, ready to receive. NULL with errno on failure
 * (EOPNOTSUPP where the ring's layout is not the striding one this shim writes).
 */
struct cbf_mprq_wq *cbf_mprq_wq_create(struct ibv_context *ctx, struct ibv_pd *pd,
                                       struct ibv_cq *cq, uint32_t max_wr, uint32_t stride_log,
                                       uint32_t strides_log)
{
    struct ibv_wq_init_attr attr;
    struct mlx5dv_wq_init_attr dv;
    struct ibv_wq_attr state;
    struct mlx5dv_obj obj;
    struct cbf_mprq_wq *w;
    int err;

    w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    memset(&attr, 0, sizeof(attr));
    attr.wq_type = IBV_WQT_RQ;
    attr.max_wr = max_wr;
    attr.max_sge = 1;
    attr.pd = pd;
    attr.cq = cq;
    memset(&dv, 0, sizeof(dv));
    dv.comp_mask = MLX5DV_WQ_INIT_ATTR_MASK_STRIDING_RQ;
    dv.striding_rq_attrs.single_stride_log_num_of_bytes = stride_log;
    dv.striding_rq_attrs.single_wqe_log_num_of_strides = strides_log;
    dv.striding_rq_attrs.two_byte_shift_en = 0;
    w->wq = mlx5dv_create_wq(ctx, &attr, &dv);
    if (!w->wq) {
        err = errno;
        free(w);
        errno = err;
        return NULL;
    }
    memset(&obj, 0, sizeof(obj));
    obj.rwq.in = w->wq;
    obj.rwq.out = &w->rwq;
    err = mlx5dv_init_obj(&obj, MLX5DV_OBJ_RWQ);
    if (!err && (w->rwq.stride != sizeof(struct mlx5_mprq_wqe) || w->rwq.wqe_cnt < max_wr))
        err = EOPNOTSUPP;
    if (!err) {
        memset(&state, 0, sizeof(state));
        state.attr_mask = IBV_WQ_ATTR_STATE;
        state.wq_state = IBV_WQS_RDY;
        err = ibv_modify_wq(w->wq, &state);
    }
    if (err) {
        ibv_destroy_wq(w->wq);
        free(w);
        errno = err;
        return NULL;
    }
    return w;
}

/* Order the entries' stores before the doorbell record's (which the NIC reads by DMA), as
 * rdma-core's udma_to_device_barrier does: x86 keeps stores in order, so only the compiler
 * must not move them; aarch64 needs a store barrier over the outer-shareable domain. */
static inline void cbf_to_device_barrier(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("" ::: "memory");
#elif defined(__aarch64__)
    __asm__ volatile("dmb oshst" ::: "memory");
#else
    __sync_synchronize();
#endif
}

/*
 * Hand `n` buffers to the NIC, in order: buffer i is `len` bytes at `addrs[i]` under `lkey`.
 * The caller never has more requests outstanding than the queue was created for (each buffer
 * is posted once until the NIC has filled it and every frame lent from it is back).
 */
void cbf_mprq_wq_post(struct cbf_mprq_wq *w, const uint64_t *addrs, size_t n, uint32_t len,
                      uint32_t lkey)
{
    struct mlx5_mprq_wqe *ring = w->rwq.buf;
    size_t i;

    if (n == 0)
        return;
    for (i = 0; i < n; i++) {
        struct mlx5_mprq_wqe *e = &ring[w->head & (w->rwq.wqe_cnt - 1)];
        memset(&e->nseg, 0, sizeof(e->nseg));
        e->dseg.byte_count = htobe32(len);
        e->dseg.lkey = htobe32(lkey);
        e->dseg.addr = htobe64(addrs[i]);
        w->head++;
    }
    cbf_to_device_barrier();
    *(volatile __be32 *)w->rwq.dbrec = htobe32(w->head & 0xffff);
}

int cbf_mprq_wq_destroy(struct cbf_mprq_wq *w)
{
    int err = ibv_destroy_wq(w->wq);
    free(w);
    return err;
}

/* An indirection table of the one work queue `w` (the receive side of an RSS queue pair).
 * NULL with errno on failure. */
struct ibv_rwq_ind_table *cbf_mprq_ind_table_create(struct ibv_context *ctx,
                                                    struct cbf_mprq_wq *w)
{
    struct ibv_rwq_ind_table_init_attr attr;
    struct ibv_wq *table[1] = {w->wq};

    memset(&attr, 0, sizeof(attr));
    attr.log_ind_tbl_size = 0;
    attr.ind_tbl = table;
    return ibv_create_rwq_ind_table(ctx, &attr);
}

int cbf_mprq_ind_table_destroy(struct ibv_rwq_ind_table *t)
{
    return ibv_destroy_rwq_ind_table(t);
}

/*
 * A raw-packet queue pair receiving through `table`: RSS with no hash fields (every frame to
 * the one queue). ConnectX-5 accepts only the Toeplitz function here, so that is the one named,
 * with a zero key (spead2's finding). NULL with errno on failure (CAP_NET_RAW is needed).
 */
struct ibv_qp *cbf_mprq_rss_qp(struct ibv_context *ctx, struct ibv_pd *pd,
                               struct ibv_rwq_ind_table *table)
{
    struct ibv_qp_init_attr_ex attr;
    uint8_t key[40];

    memset(key, 0, sizeof(key));
    memset(&attr, 0, sizeof(attr));
    attr.qp_type = IBV_QPT_RAW_PACKET;
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH;
    attr.pd = pd;
    attr.rwq_ind_tbl = table;
    attr.rx_hash_conf.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
    attr.rx_hash_conf.rx_hash_key_len = sizeof(key);
    attr.rx_hash_conf.rx_hash_key = key;
    attr.rx_hash_conf.rx_hash_fields_mask = 0;
    return ibv_create_qp_ex(ctx, &attr);
}

/* Sizes and offsets of the two structures Rust shares with this file, for a test that the two
 * agree: caps size, then each field's offset in order; then the completion's size, byte_cnt's
 * and status's offsets; then the two enum values Rust reads them with (the raw-packet queue
 * pair type, a bit number in qp_types, and the success status). */
void cbf_mprq_layout(size_t out[15])
{
    out[0] = sizeof(struct cbf_mprq_caps);
    out[1] = offsetof(struct cbf_mprq_caps, striding);
    out[2] = offsetof(struct cbf_mprq_caps, mpw_allowed);
    out[3] = offsetof(struct cbf_mprq_caps, min_stride_log);
    out[4] = offsetof(struct cbf_mprq_caps, max_stride_log);
    out[5] = offsetof(struct cbf_mprq_caps, min_strides_log);
    out[6] = offsetof(struct cbf_mprq_caps, max_strides_log);
    out[7] = offsetof(struct cbf_mprq_caps, qp_types);
    out[8] = offsetof(struct cbf_mprq_caps, max_cqe);
    out[9] = offsetof(struct cbf_mprq_caps, max_qp_wr);
    out[10] = sizeof(struct cbf_stride_wc);
    out[11] = offsetof(struct cbf_stride_wc, byte_cnt);
    out[12] = offsetof(struct cbf_stride_wc, status);
    out[13] = IBV_QPT_RAW_PACKET;
    out[14] = IBV_WC_SUCCESS;
}
