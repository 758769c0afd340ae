/* pool.h -- the live pool object, thread caches and per-class shared pools (internal), and base.c's helpers. */
#ifndef RTK_PMEM_POOL_H
#define RTK_PMEM_POOL_H
#include <limits.h>

#include "common/os.h"
#include "pmem/pmem_internal.h"

/* per-class shared pool: chains of free records moved from thread caches, and partly used segments */
struct rtk_cpool {
    atomic_int lock;
    uint32_t segments;
    struct rtk_vstack chains;   /* head, tail, count */
    struct rtk_vstack partials; /* segment, next unused slot, - */
    uint64_t free_count;        /* records in chains */
    int64_t allocs, req;        /* live records / requested bytes counted here (recovered, dead threads) */
} __attribute__((aligned(64)));

struct rtk_tclass {
    char *head, *tail;
    uint64_t count;
    uint64_t seg;           /* current segment, UINT64_MAX when none */
    uint64_t next, nslots;  /* bump cursor in the current segment */
    int64_t allocs, req;    /* net live records / bytes through this thread */
};

struct rtk_tcache {
    atomic_int lock;            /* fallback when membarrier is missing */
    atomic_int busy, stealing;  /* asymmetric Dekker: the owner pays plain stores, the stealer a membarrier */
    struct rtkit_pmem_pool *pool;
    struct rtk_tcache *next, *prev;
    size_t len;
    struct rtk_tclass cls[];
};

struct rtkit_pmem_pool {
    char *base;
    struct rtk_geom g;
    int fd, anonymous, by_libpmem, is_pmem, pkind, durable, have_key, was_clean, asym;
    uint64_t file_dev, file_ino; /* the pool file, for the "already open in this process" check (pool.c) */
    uint64_t page;
    size_t self_len;
    _Atomic uint64_t *segtab; /* persistent */
    uint64_t *vseg;           /* volatile mirror; RTK_SEG_TAIL for extent tails */
    struct rtk_cpool *cp;     /* [ncls + 1] */
    pthread_mutex_t seg_lock;
    /* the top segments known in use, [nsegs - segs_top_used, nsegs): a search for a short run starts below them */
    uint64_t segs_top_used;
    uint64_t segs_free;
    uint64_t ext_count, ext_bytes, ext_req; /* under seg_lock */
    pthread_key_t key;
    pthread_mutex_t reg_lock;
    struct rtk_tcache *tcaches;
    uint32_t nthreads;
    /* background thread */
    pthread_t bg;
    int bg_running, bg_stop;
    pthread_mutex_t bg_mu;
    pthread_cond_t bg_cv;
    int rebalance_ms, rebalance_min, recovery_threads;
    _Atomic uint64_t bg_runs, bg_moves, bg_moved;
    /* recovery figures */
    uint64_t recovered_records, recovered_scanned, recovery_ns;
    uint32_t recovery_threads_used;
    char path[PATH_MAX];
};

/* base.c */
void *rtk_map_anon(size_t len);
uint64_t rtk_now_ns(void);
void rtk_persist(struct rtkit_pmem_pool *p, const void *addr, uint64_t len);
/* pool.c: the header's open count and clean flag (clean 0 also counts an open), persisted */
void rtk_write_mutable(struct rtkit_pmem_pool *p, int clean);
int rtk_read_header(int fd, const char *path, struct rtk_hdr *h, struct rtk_geom *g);
#endif
