/* pool.c -- PMEM pool lifetime: settings, create/open/anonymous mapping, close (recovery: recover.c; caches: cache.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>
#ifdef RTK_HAVE_LIBPMEM
#include <libpmem.h>
#endif
#include "common/options.h"
#include "common/say.h"
#include "pmem/cache.h"
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
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    p->recovery_threads = o->recovery_threads > 0 ? o->recovery_threads : (int)(ncpu < 1 ? 1 : ncpu > 16 ? 16 : ncpu);
}

/* ---- pools open in this process: a second open of the same file says so (flock alone cannot tell a lock
 * held by this process from one held by another) ---- */

#define RTK_OPEN_MAX 256
static struct { uint64_t dev, ino; } g_open[RTK_OPEN_MAX];
static pthread_mutex_t g_open_mu = PTHREAD_MUTEX_INITIALIZER;

static void open_note(struct rtkit_pmem_pool *p, int add) {
    struct stat st;
    if (add) {
        if (fstat(p->fd, &st) != 0) return;
        p->file_dev = (uint64_t)st.st_dev;
        p->file_ino = (uint64_t)st.st_ino;
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

static int open_here(int fd) {
    struct stat st;
    int here = 0;
    if (fstat(fd, &st) != 0) return 0;
    pthread_mutex_lock(&g_open_mu);
    for (int i = 0; i < RTK_OPEN_MAX && !here; i++)
        here = g_open[i].ino == (uint64_t)st.st_ino && g_open[i].dev == (uint64_t)st.st_dev;
    pthread_mutex_unlock(&g_open_mu);
    return here;
}

/* ---- pool object ---- */

static struct rtkit_pmem_pool *pool_alloc(const struct rtk_geom *g, const char *path) {
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
    p->page = (uint64_t)sysconf(_SC_PAGESIZE);
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
    munmap(p, p->self_len);
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
    munmap(p->base, p->g.size);
    p->base = NULL;
}

static int map_file(struct rtkit_pmem_pool *p, const char *path, int force_msync) {
    struct statfs sf;
    int on_ram_fs = fstatfs(p->fd, &sf) == 0 && (sf.f_type == 0x01021994 /* tmpfs */ || sf.f_type == 0x858458f6 /* ramfs */);
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
    void *a = mmap(NULL, p->g.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, p->fd, 0);
    if (a == MAP_FAILED) return rtk_fail(RTKIT_PMEM_ESYS, errno, path, "cannot map the pool: %s", strerror(errno));
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

static int finish_open(struct rtkit_pmem_pool *p, const rtkit_pmem_options *o) {
    resolve_runtime(p, o);
    p->segtab = (_Atomic uint64_t *)(p->base + RTK_META_HDR);
    if (pthread_key_create(&p->key, rtk_tcache_destructor) != 0)
        return rtk_fail(RTKIT_PMEM_ESYS, EAGAIN, p->path, "no thread-specific key left");
    p->have_key = 1;
    p->asym = rtk_setting_on(RTK_OPT_PMEM_NO_MEMBARRIER) ? 0 : rtk_membarrier_register();  /* read by resolve_runtime */
    int rc = rtk_recover(p);  /* it also clears the clean flag, before its first write */
    if (rc) return rc;
    if (p->rebalance_ms > 0) {
        if (pthread_create(&p->bg, NULL, rtk_background_main, p) == 0) p->bg_running = 1;
    }
    return 0;
}

static void abort_open(struct rtkit_pmem_pool *p) {
    if (p->have_key) pthread_key_delete(p->key);
    unmap_data(p);
    if (p->fd >= 0) close(p->fd);
    pool_release_mem(p);
}

/* the geometry of a new pool: each size from the options, else from RTKIT_PMEM_*; 0 or the failure's code */
static int geom_from_opts(const rtkit_pmem_options *o, uint64_t size, const char *what, struct rtk_geom *g) {
    pthread_once(&env_once, env_read);
    uint64_t seg = o->segment_size ? o->segment_size : (uint64_t)rtk_setting_bytes(RTK_OPT_PMEM_SEGMENT_SIZE);
    uint32_t block = o->block_size ? o->block_size : (uint32_t)rtk_setting_bytes(RTK_OPT_PMEM_BLOCK_SIZE);
    uint32_t maxrec = o->max_record ? o->max_record : (uint32_t)rtk_setting_bytes(RTK_OPT_PMEM_MAX_RECORD);
    char why[200];
    if (rtk_geom_compute(g, size, seg, block, maxrec, why, sizeof why))
        return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, what, "%s", why);
    return 0;
}

static void init_header(struct rtkit_pmem_pool *p) {
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
    h->created_ns = (uint64_t)time(NULL) * 1000000000ull;
    memcpy(h->magic, RTK_MAGIC, 8);
    h->csum = rtk_hdr_csum(h);
    h->mcsum = rtk_hdr_mcsum(h);
}

static uint64_t new_uuid(void) {
    uint64_t x = rtk_now_ns() ^ ((uint64_t)getpid() << 32);
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        uint64_t r;
        if (read(fd, &r, sizeof r) == sizeof r) x ^= r;
        close(fd);
    }
    return rtk_mix64(x) | 1;
}

RTK_EXPORT int rtkit_pmem_anonymous(uint64_t size, const rtkit_pmem_options *opts, rtkit_pmem_pool **out) {
    rtkit_pmem_options d;
    if (!opts) rtkit_pmem_options_init(&d), opts = &d;
    if (!out) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, "<anonymous>", "out pointer is NULL");
    *out = NULL;
    struct rtk_geom g;
    int grc = geom_from_opts(opts, size, "<anonymous>", &g);
    if (grc) return grc;
    g.uuid = new_uuid();
    struct rtkit_pmem_pool *p = pool_alloc(&g, NULL);
    if (!p) return rtk_fail(RTKIT_PMEM_ESYS, ENOMEM, "<anonymous>", "out of memory for pool tables");
    void *a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a == MAP_FAILED) {
        int e = errno;
        pool_release_mem(p);
        return rtk_fail(RTKIT_PMEM_ESYS, e, "<anonymous>", "cannot map %llu bytes: %s", (unsigned long long)size,
                        strerror(e));
    }
    p->base = a;
    p->anonymous = 1;
    p->pkind = RTKIT_PMEM_PERSIST_NONE;
    init_header(p);
    int rc = finish_open(p, opts);
    if (rc) {
        abort_open(p);
        return rc;
    }
    *out = p;
    return 0;
}

RTK_EXPORT int rtkit_pmem_create(const char *path, uint64_t size, const rtkit_pmem_options *opts,
                                 rtkit_pmem_pool **out) {
    rtkit_pmem_options d;
    if (!opts) rtkit_pmem_options_init(&d), opts = &d;
    if (!path || !*path || !out) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, path, "path and out are required");
    *out = NULL;
    struct rtk_geom g;
    int grc = geom_from_opts(opts, size, path, &g);
    if (grc) return grc;
    /* O_EXCL: a pool is only ever a new file (never through a planted link); 0666 leaves the mode to the umask */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        if (e == EEXIST) return rtk_fail(RTKIT_PMEM_EEXIST, e, path, "file exists; open it or remove it first");
        return rtk_fail(RTKIT_PMEM_ESYS, e, path, "cannot create the pool file: %s", strerror(e));
    }
    flock(fd, LOCK_EX | LOCK_NB);
    int e = posix_fallocate(fd, 0, (off_t)size);
    if (e == EOPNOTSUPP || e == EINVAL) e = ftruncate(fd, (off_t)size) ? errno : 0;
    if (e) {
        close(fd);
        unlink(path);
        if (e == ENOSPC || e == EFBIG)
            return rtk_fail(RTKIT_PMEM_ENOSPC, e, path, "no space for a pool of %llu bytes: %s",
                            (unsigned long long)size, strerror(e));
        return rtk_fail(RTKIT_PMEM_ESYS, e, path, "cannot size the pool file: %s", strerror(e));
    }
    g.uuid = new_uuid();
    struct rtkit_pmem_pool *p = pool_alloc(&g, path);
    if (!p) {
        close(fd);
        unlink(path);
        return rtk_fail(RTKIT_PMEM_ESYS, ENOMEM, path, "out of memory for pool tables");
    }
    p->fd = fd;
    int rc = map_file(p, path, opts->force_msync);
    if (rc) {
        abort_open(p);
        unlink(path);
        return rc;
    }
    /* the file is all zeros (a free segment table); the header goes last, so a crash during create
     * leaves a file that is not a pool rather than a broken pool */
    init_header(p);
    struct rtk_hdr *h = (struct rtk_hdr *)p->base;
    char magic[8];
    memcpy(magic, h->magic, 8);
    memset(h->magic, 0, 8);
    rtk_persist(p, p->base, g.data_off);
    memcpy(h->magic, magic, 8);
    rtk_persist(p, h, sizeof *h);
    rc = finish_open(p, opts);
    if (rc) {
        abort_open(p);
        unlink(path);
        return rc;
    }
    open_note(p, 1);
    *out = p;
    return 0;
}

RTK_EXPORT int rtkit_pmem_open(const char *path, const rtkit_pmem_options *opts, rtkit_pmem_pool **out) {
    rtkit_pmem_options d;
    if (!opts) rtkit_pmem_options_init(&d), opts = &d;
    if (!path || !*path || !out) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, path, "path and out are required");
    *out = NULL;
    int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC); /* a FIFO or device never blocks: refused below */
    if (fd < 0) return rtk_fail(RTKIT_PMEM_ESYS, errno, path, "cannot open the pool: %s", strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        if (e == EWOULDBLOCK) {
            int here = open_here(fd);
            close(fd);
            return rtk_fail(RTKIT_PMEM_EBUSY, EBUSY, path, here ? "pool is already open in this process (close it first)"
                                                             : "pool is open in another process");
        }
        close(fd);
        return rtk_fail(RTKIT_PMEM_ESYS, e, path, "cannot lock the pool: %s", strerror(e));
    }
    struct rtk_hdr h;
    struct rtk_geom g;
    int rc = rtk_read_header(fd, path, &h, &g);
    if (!rc && ((opts->segment_size && opts->segment_size != g.seg_size) ||
                (opts->block_size && opts->block_size != g.block) ||
                (opts->max_record && opts->max_record != g.max_record) ||
                (opts->expect_size && opts->expect_size != g.size)))
        rc = rtk_fail(RTKIT_PMEM_EGEOMETRY, EINVAL, path,
                      "pool has size %llu, segment %llu, block %u, max record %u; asked for size %llu, segment %llu, "
                      "block %u, max record %u (0 = any)",
                      (unsigned long long)g.size, (unsigned long long)g.seg_size, g.block, g.max_record,
                      (unsigned long long)opts->expect_size, (unsigned long long)opts->segment_size, opts->block_size,
                      opts->max_record);
    if (rc) {
        close(fd);
        return rc;
    }
    struct rtkit_pmem_pool *p = pool_alloc(&g, path);
    if (!p) {
        close(fd);
        return rtk_fail(RTKIT_PMEM_ESYS, ENOMEM, path, "out of memory for pool tables");
    }
    p->fd = fd;
    p->was_clean = h.clean && h.mcsum == rtk_hdr_mcsum(&h);
    rc = map_file(p, path, opts->force_msync);
    if (!rc) rc = finish_open(p, opts);
    if (rc) {
        abort_open(p);
        return rc;
    }
    open_note(p, 1);
    *out = p;
    return 0;
}

RTK_EXPORT int rtkit_pmem_sync(rtkit_pmem_pool *p) {
    if (!p) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool is NULL");
    if (p->pkind == RTKIT_PMEM_PERSIST_MSYNC) {
        if (msync(p->base, p->g.size, MS_SYNC))
            return rtk_fail(RTKIT_PMEM_ESYS, errno, p->path, "msync failed: %s", strerror(errno));
    } else {
        rtk_persist(p, p->base, p->g.size);
    }
    return 0;
}

RTK_EXPORT int rtkit_pmem_close(rtkit_pmem_pool *p) {
    if (!p) return 0;
    if (p->bg_running) {
        pthread_mutex_lock(&p->bg_mu);
        p->bg_stop = 1;
        pthread_cond_signal(&p->bg_cv);
        pthread_mutex_unlock(&p->bg_mu);
        pthread_join(p->bg, NULL);
    }
    rtk_release_all_tcaches(p);
    pthread_key_delete(p->key);
    int rc = 0;
    if (!p->anonymous) {
        /* a clean close makes everything durable: payloads never persisted, and in volatile mode the headers */
        rtk_write_summaries(p);  /* before the sync and the clean flag: current whenever the flag is set */
        if (p->pkind != RTKIT_PMEM_PERSIST_NONE) rc = rtkit_pmem_sync(p);
        rtk_write_mutable(p, 1);
    }
    if (p->file_ino) open_note(p, 0);
    unmap_data(p);
    if (p->fd >= 0) close(p->fd);
    pool_release_mem(p);
    return rc;
}
