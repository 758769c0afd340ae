/* pool_setup.c -- what opening and closing a PMEM pool is made of: its settings, its tables, the mapping of its
 * file, a new pool's header, and the registry of pools open in this process. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#ifdef RTK_HAVE_LIBPMEM
#include <libpmem.h>
#endif
#include "common/options.h"
#include "common/say.h"
#include "pmem/cache.h"
#include "pmem/pool_setup.h"
#include "pmem/recover.h"

/* ---- settings (rtkit/config.py's pmem_* rows through common/options): read once per process, so a bad value is
 * said once however many pools are opened; where the preload allocator read them at its start, nothing is left */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void env_read(void) {
    int from = rtk_kept_count();
    rtk_opt_load(RTK_PART_PMEM);
    rtk_say_kept(from, NULL, NULL);
}

RTK_EXPORT void rtkit_pmem_options_init(rtkit_pmem_options *o) {
    memset(o, 0, sizeof *o);
    o->durable = -1;
}

static void resolve_runtime(struct rtkit_pmem_pool *p, const rtkit_pmem_options *o) {
    pthread_once(&env_once, env_read);
    p->durable = o->durable >= 0 ? !!o->durable : rtk_setting_on(RTK_OPT_PMEM_DURABLE);
    p->rebalance_ms = o->rebalance_ms ? o->rebalance_ms : (int)rtk_setting_num(RTK_OPT_PMEM_REBALANCE_MS);
    p->rebalance_min = o->rebalance_min > 0 ? o->rebalance_min : (int)rtk_setting_num(RTK_OPT_PMEM_REBALANCE_MIN);
    long ncpu = rtk_os_cpu_count();
    p->recovery_threads = o->recovery_threads > 0 ? o->recovery_threads : (int)(ncpu > 16 ? 16 : ncpu);
}

/* ---- pools open in this process: a second open of the same file says so (flock alone cannot tell a lock
 * held by this process from one held by another) ---- */

#define RTK_OPEN_MAX 256
static struct { uint64_t dev, ino; } g_open[RTK_OPEN_MAX];
static pthread_mutex_t g_open_mu = PTHREAD_MUTEX_INITIALIZER;

void rtk_pool_note_open(struct rtkit_pmem_pool *p, int add) {
    rtk_file_info_t st;
    if (add) {
        if (rtk_os_file_info(p->fd, &st) != 0) return;
        p->file_dev = st.dev;
        p->file_ino = st.ino;
    }
    pthread_mutex_lock(&g_open_mu);
    for (int i = 0; i < RTK_OPEN_MAX; i++) {
        if (add && !g_open[i].ino) {
            g_open[i].dev = p->file_dev;
            g_open[i].ino = p->file_ino;
            break;
        }
        if (!add && g_open[i].ino == p->file_ino && g_open[i].dev == p->file_dev && p->file_ino) {
            g_open[i].ino = g_open[i].dev = 0;
            break;
        }
    }
    pthread_mutex_unlock(&g_open_mu);
}

int rtk_pool_open_here(int fd) {
    rtk_file_info_t st;
    int here = 0;
    if (rtk_os_file_info(fd, &st) != 0) return 0;
    pthread_mutex_lock(&g_open_mu);
    for (int i = 0; i < RTK_OPEN_MAX && !here; i++)
        here = g_open[i].ino == st.ino && g_open[i].dev == st.dev;
    pthread_mutex_unlock(&g_open_mu);
    return here;
}

/* ---- pool object ---- */

struct rtkit_pmem_pool *rtk_pool_new(const struct rtk_geom *g, const char *path) {
    size_t cp_bytes = ((size_t)g->ncls + 1) * sizeof(struct rtk_cpool);
    size_t vseg_bytes = g->nsegs * sizeof(uint64_t);
    size_t head = (sizeof(struct rtkit_pmem_pool) + 63) & ~(size_t)63; /* the class pools are 64-aligned */
    size_t len = head + cp_bytes + vseg_bytes;
    len = (len + 4095) & ~(size_t)4095;
    char *m = rtk_map_anon(len);
    if (!m) return NULL;
    struct rtkit_pmem_pool *p = (struct rtkit_pmem_pool *)m;
    p->self_len = len;
    p->g = *g;
    p->cp = (struct rtk_cpool *)(m + head);
    p->vseg = (uint64_t *)(m + head + cp_bytes);
    p->fd = -1;
    p->page = (uint64_t)rtk_os_page_size();
    snprintf(p->path, sizeof p->path, "%s", path ? path : "<anonymous>");
    pthread_mutex_init(&p->seg_lock, NULL);
    pthread_mutex_init(&p->reg_lock, NULL);
    pthread_mutex_init(&p->bg_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->bg_cv, &ca);
    pthread_condattr_destroy(&ca);
    return p;
}

static void pool_release_mem(struct rtkit_pmem_pool *p) {
    for (uint32_t c = 0; c <= p->g.ncls; c++) {
        rtk_vstack_free(&p->cp[c].chains);
        rtk_vstack_free(&p->cp[c].partials);
    }
    rtk_os_unmap(p, p->self_len);
}

static void unmap_data(struct rtkit_pmem_pool *p) {
    if (!p->base) return;
#ifdef RTK_HAVE_LIBPMEM
    if (p->by_libpmem) {
        pmem_unmap(p->base, p->g.size);
        p->base = NULL;
        return;
    }
#endif
    rtk_os_unmap(p->base, p->g.size);
    p->base = NULL;
}

int rtk_pool_map_file(struct rtkit_pmem_pool *p, const char *path, int force_msync) {
    int on_ram_fs = rtk_os_fd_on_ram_fs(p->fd);
#ifdef RTK_HAVE_LIBPMEM
    size_t mapped = 0;
    int is_pmem = 0;
    void *a = pmem_map_file(path, 0, 0, 0, &mapped, &is_pmem);
    if (!a) return rtk_fail(RTKIT_PMEM_ESYS, errno, path, "cannot map the pool: %s", strerror(errno));
    if (mapped != p->g.size) {
        pmem_unmap(a, mapped);
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "mapped %zu bytes, header says %llu", mapped,
                        (unsigned long long)p->g.size);
    }
    p->base = a;
    p->by_libpmem = 1;
    p->is_pmem = is_pmem;
#else
    /* file-backed and shared: no swap reservation to make (MAP_NORESERVE says so for strict-overcommit hosts) */
    void *a;
    int e = rtk_os_map_shared(p->fd, p->g.size, 1, &a);
    if (e) return rtk_fail(RTKIT_PMEM_ESYS, -e, path, "cannot map the pool: %s", strerror(-e));
    p->base = a;
#endif
    if (p->is_pmem)
        p->pkind = RTKIT_PMEM_PERSIST_FLUSH;
    else if (on_ram_fs && !force_msync)
        p->pkind = RTKIT_PMEM_PERSIST_NONE;
    else
        p->pkind = RTKIT_PMEM_PERSIST_MSYNC;
    return 0;
}

int rtk_pool_finish_open(struct rtkit_pmem_pool *p, const rtkit_pmem_options *o) {
    resolve_runtime(p, o);
    p->segtab = (_Atomic uint64_t *)(p->base + RTK_META_HDR);
    if (pthread_key_create(&p->key, rtk_tcache_destructor) != 0)
        return rtk_fail(RTKIT_PMEM_ESYS, EAGAIN, p->path, "no thread-specific key left");
    p->have_key = 1;
    p->asym = rtk_setting_on(RTK_OPT_PMEM_MEMBARRIER) && rtk_membarrier_register();  /* read by resolve_runtime */
    int rc = rtk_recover(p);  /* it also clears the clean flag, before its first write */
    if (rc) return rc;
    if (p->rebalance_ms > 0) {
        if (pthread_create(&p->bg, NULL, rtk_background_main, p) == 0) p->bg_running = 1;
    }
    return 0;
}

void rtk_pool_release(struct rtkit_pmem_pool *p) {
    unmap_data(p);
    if (p->fd >= 0) rtk_os_close(p->fd);
    pool_release_mem(p);
}

void rtk_pool_abort_open(struct rtkit_pmem_pool *p) {
    if (p->have_key) pthread_key_delete(p->key);
    rtk_pool_release(p);
}

/* the geometry of a new pool: each size from the options, else from RTKIT_PMEM_*; 0 or the failure's code */
int rtk_pool_geometry(const rtkit_pmem_options *o, uint64_t size, const char *what, struct rtk_geom *g) {
    pthread_once(&env_once, env_read);
    uint64_t seg = o->segment_size ? o->segment_size : (uint64_t)rtk_setting_bytes(RTK_OPT_PMEM_SEGMENT_SIZE);
    uint32_t block = o->block_size ? o->block_size : (uint32_t)rtk_setting_bytes(RTK_OPT_PMEM_BLOCK_SIZE);
    uint32_t maxrec = o->max_record ? o->max_record : (uint32_t)rtk_setting_bytes(RTK_OPT_PMEM_MAX_RECORD);
    char why[200];
    if (rtk_geom_compute(g, size, seg, block, maxrec, why, sizeof why))
        return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, what, "%s", why);
    return 0;
}

void rtk_pool_init_header(struct rtkit_pmem_pool *p) {
    struct rtk_hdr *h = (struct rtk_hdr *)p->base;
    memset(h, 0, sizeof *h);
    h->version = RTKIT_PMEM_FORMAT_VERSION;
    h->hdr_size = sizeof *h;
    h->pool_size = p->g.size;
    h->seg_size = p->g.seg_size;
    h->block_size = p->g.block;
    h->max_record = p->g.max_record;
    h->nsegs = p->g.nsegs;
    h->data_off = p->g.data_off;
    h->uuid = p->g.uuid;
    h->created_ns = rtk_os_unix_s() * 1000000000ull;
    memcpy(h->magic, RTK_MAGIC, 8);
    h->csum = rtk_hdr_csum(h);
    h->mcsum = rtk_hdr_mcsum(h);
}

uint64_t rtk_pool_new_uuid(void) {
    uint64_t x = rtk_now_ns() ^ ((uint64_t)rtk_os_pid() << 32), r;
    if (rtk_os_random(&r, sizeof r) == 0) x ^= r;
    return rtk_mix64(x) | 1;
}

