/* pool.c -- PMEM pool lifetime: create/open/anonymous mapping, header validation, parallel recovery, close. */
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
#include "pmem/pool.h"

static __thread char rtk_errbuf[384];

int rtk_fail(int code, int err, const char *path, const char *fmt, ...) {
    int n = snprintf(rtk_errbuf, sizeof rtk_errbuf, "%s: ", path && *path ? path : "<pool>");
    if (n < 0 || n >= (int)sizeof rtk_errbuf) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rtk_errbuf + n, sizeof rtk_errbuf - n, fmt, ap);
    va_end(ap);
    errno = err;
    return code;
}

RTK_EXPORT const char *rtkit_pmem_last_error(void) { return rtk_errbuf; }
RTK_EXPORT int rtkit_pmem_version(void) { return RTKIT_PMEM_FORMAT_VERSION; }

RTK_EXPORT const char *rtkit_pmem_strerror(int code) {
    switch (code) {
    case RTKIT_PMEM_OK: return "ok";
    case RTKIT_PMEM_EINVAL: return "invalid argument";
    case RTKIT_PMEM_ESYS: return "system call failed";
    case RTKIT_PMEM_ENOTPOOL: return "not an rtkit pool";
    case RTKIT_PMEM_EVERSION: return "unsupported pool version";
    case RTKIT_PMEM_EGEOMETRY: return "pool geometry differs";
    case RTKIT_PMEM_ECORRUPT: return "pool is corrupt";
    case RTKIT_PMEM_ENOSPC: return "no space";
    case RTKIT_PMEM_ETOOBIG: return "allocation larger than the largest extent";
    case RTKIT_PMEM_EDOUBLEFREE: return "double free";
    case RTKIT_PMEM_EBADHANDLE: return "not a record of this pool";
    case RTKIT_PMEM_EBUSY: return "pool is open in another process";
    case RTKIT_PMEM_EEXIST: return "file exists";
    default: return "unknown error";
    }
}

/* ---- mmap'ed helpers (no malloc anywhere in the pool) ---- */

void *rtk_map_anon(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int rtk_vstack_push(struct rtk_vstack *s, uint64_t a, uint64_t b, uint64_t c) {
    if (s->n == s->cap) {
        uint64_t cap = s->cap ? s->cap * 2 : 4096 / 24;
        void *p = rtk_map_anon(cap * 24);
        if (!p) return -1;
        if (s->e) {
            memcpy(p, s->e, s->n * 24);
            munmap(s->e, s->cap * 24);
        }
        s->e = p;
        s->cap = cap;
    }
    s->e[s->n][0] = a;
    s->e[s->n][1] = b;
    s->e[s->n][2] = c;
    __atomic_store_n(&s->n, s->n + 1, __ATOMIC_RELAXED); /* peeked at without the lock */
    return 0;
}

int rtk_vstack_pop(struct rtk_vstack *s, uint64_t out[3]) {
    if (s->n == 0) return 0;
    __atomic_store_n(&s->n, s->n - 1, __ATOMIC_RELAXED);
    memcpy(out, s->e[s->n], 24);
    return 1;
}

void rtk_vstack_free(struct rtk_vstack *s) {
    if (s->e) munmap(s->e, s->cap * 24);
    s->e = NULL;
    s->n = s->cap = 0;
}

/* ---- geometry ---- */

static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

int rtk_geom_compute(struct rtk_geom *g, uint64_t size, uint64_t seg_size, uint32_t block, uint32_t max_record,
                     char *why, size_t whylen) {
    memset(g, 0, sizeof *g);
    if (!is_pow2(block) || block < 8 || block > 65536) {
        snprintf(why, whylen, "block size %u is not a power of two in [8, 65536]", block);
        return -1;
    }
    if (seg_size < 4096 || seg_size % 4096 || seg_size % block) {
        snprintf(why, whylen, "segment size %llu is not a multiple of 4096 and of the block size",
                 (unsigned long long)seg_size);
        return -1;
    }
    if (max_record < 8 || (uint64_t)max_record + RTK_HDR > seg_size) {
        snprintf(why, whylen, "max record %u must be in [8, segment size - %d]", max_record, RTK_HDR);
        return -1;
    }
    g->block = block;
    g->shift = (uint32_t)__builtin_ctz(block);
    g->seg_size = seg_size;
    g->max_record = max_record;
    g->ncls = (uint32_t)(((uint64_t)max_record + RTK_HDR + block - 1) >> g->shift);
    g->cmin = (uint32_t)((RTK_HDR + 8 + block - 1) >> g->shift);
    if (g->ncls > RTK_MAX_CLASSES) {
        snprintf(why, whylen, "max record / block size gives %u classes, more than %u", g->ncls, RTK_MAX_CLASSES);
        return -1;
    }
    uint64_t n = size / seg_size;
    while (n > 0) {
        uint64_t meta = RTK_META_HDR + n * 8;
        meta = (meta + seg_size - 1) / seg_size * seg_size;
        if (meta + n * seg_size <= size) break;
        n--;
    }
    if (n == 0) {
        snprintf(why, whylen, "size %llu is below one segment of %llu bytes plus the pool header",
                 (unsigned long long)size, (unsigned long long)seg_size);
        return -1;
    }
    g->size = size;
    g->nsegs = n;
    g->data_off = (RTK_META_HDR + n * 8 + seg_size - 1) / seg_size * seg_size;
    g->seg_shift = is_pow2(seg_size) ? (uint32_t)__builtin_ctzll(seg_size) : 0;
    return 0;
}

/* ---- settings (rtkit/config.py's pmem_* rows through common/options: one stderr line per bad value, then the default) ---- */

/* read once per process, so a bad value is reported once however many pools are opened */
static struct {
    size_t segment_size, block_size, max_record;
    long rebalance_ms, rebalance_min;
    int durable, no_membarrier;
} env_cfg;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void env_read(void) {
    rtk_opt_size(RTK_OPT_PMEM_SEGMENT_SIZE, &env_cfg.segment_size);
    rtk_opt_size(RTK_OPT_PMEM_BLOCK_SIZE, &env_cfg.block_size);
    rtk_opt_size(RTK_OPT_PMEM_MAX_RECORD, &env_cfg.max_record);
    rtk_opt_int(RTK_OPT_PMEM_REBALANCE_MS, &env_cfg.rebalance_ms);
    rtk_opt_int(RTK_OPT_PMEM_REBALANCE_MIN, &env_cfg.rebalance_min);
    rtk_opt_bool(RTK_OPT_PMEM_DURABLE, &env_cfg.durable);
    rtk_opt_bool(RTK_OPT_PMEM_NO_MEMBARRIER, &env_cfg.no_membarrier);
}

RTK_EXPORT void rtkit_pmem_options_init(rtkit_pmem_options *o) {
    memset(o, 0, sizeof *o);
    o->durable = -1;
}

static void resolve_runtime(struct rtkit_pmem_pool *p, const rtkit_pmem_options *o) {
    pthread_once(&env_once, env_read);
    p->durable = o->durable >= 0 ? !!o->durable : env_cfg.durable;
    p->rebalance_ms = o->rebalance_ms ? o->rebalance_ms : (int)env_cfg.rebalance_ms;
    p->rebalance_min = o->rebalance_min > 0 ? o->rebalance_min : (int)env_cfg.rebalance_min;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    p->recovery_threads = o->recovery_threads > 0 ? o->recovery_threads : (int)(ncpu < 1 ? 1 : ncpu > 16 ? 16 : ncpu);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* ---- persistence ---- */

void rtk_persist(struct rtkit_pmem_pool *p, const void *addr, uint64_t len) {
    switch (p->pkind) {
    case RTKIT_PMEM_PERSIST_FLUSH:
#ifdef RTK_HAVE_LIBPMEM
        pmem_persist(addr, len);
#endif
        break;
    case RTKIT_PMEM_PERSIST_MSYNC: {
        uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(p->page - 1);
        msync((void *)a, (uintptr_t)addr + len - a, MS_SYNC);
        break;
    }
    default:
        /* anonymous memory or tmpfs: executed stores reach the page cache even if the process is killed
         * next, so only the compiler must keep them in program order */
        atomic_signal_fence(memory_order_seq_cst);
        break;
    }
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
    void *a = mmap(NULL, p->g.size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
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

static void write_mutable(struct rtkit_pmem_pool *p, int clean) {
    struct rtk_hdr *h = (struct rtk_hdr *)p->base;
    if (!clean) h->open_count++;
    h->clean = (uint64_t)clean;
    h->mcsum = rtk_hdr_mcsum(h);
    rtk_persist(p, &h->open_count, 3 * sizeof(uint64_t));
}

int rtk_recover(struct rtkit_pmem_pool *p);

static int finish_open(struct rtkit_pmem_pool *p, const rtkit_pmem_options *o) {
    resolve_runtime(p, o);
    p->segtab = (_Atomic uint64_t *)(p->base + RTK_META_HDR);
    if (pthread_key_create(&p->key, rtk_tcache_destructor) != 0)
        return rtk_fail(RTKIT_PMEM_ESYS, EAGAIN, p->path, "no thread-specific key left");
    p->have_key = 1;
    p->asym = env_cfg.no_membarrier ? 0 : rtk_membarrier_register();  /* env_cfg: read by resolve_runtime */
    int rc = rtk_recover(p);
    if (rc) return rc;
    if (!p->anonymous) write_mutable(p, 0);
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
    uint64_t seg = o->segment_size ? o->segment_size : (uint64_t)env_cfg.segment_size;
    uint32_t block = o->block_size ? o->block_size : (uint32_t)env_cfg.block_size;
    uint32_t maxrec = o->max_record ? o->max_record : (uint32_t)env_cfg.max_record;
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
    uint64_t x = now_ns() ^ ((uint64_t)getpid() << 32);
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
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
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
    *out = p;
    return 0;
}

/* read and validate a pool header without mapping; shared with the offline checker */
int rtk_read_header(int fd, const char *path, struct rtk_hdr *h, struct rtk_geom *g) {
    struct stat st;
    if (fstat(fd, &st)) return rtk_fail(RTKIT_PMEM_ESYS, errno, path, "cannot stat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return rtk_fail(RTKIT_PMEM_ENOTPOOL, EINVAL, path, "not a regular file");
    if ((uint64_t)st.st_size < sizeof *h || pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h)
        return rtk_fail(RTKIT_PMEM_ENOTPOOL, EINVAL, path, "file too small to be an rtkit pool");
    if (memcmp(h->magic, RTK_MAGIC, 8))
        return rtk_fail(RTKIT_PMEM_ENOTPOOL, EINVAL, path, "not an rtkit pool (bad magic)");
    if (h->version != RTKIT_PMEM_FORMAT_VERSION)
        return rtk_fail(RTKIT_PMEM_EVERSION, EINVAL, path, "pool format version %u, this library reads version %d",
                        h->version, RTKIT_PMEM_FORMAT_VERSION);
    if (h->csum != rtk_hdr_csum(h))
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "pool header checksum mismatch (header corrupt)");
    char why[200];
    if (rtk_geom_compute(g, h->pool_size, h->seg_size, h->block_size, h->max_record, why, sizeof why) ||
        g->nsegs != h->nsegs || g->data_off != h->data_off)
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "pool header geometry is inconsistent");
    if ((uint64_t)st.st_size != h->pool_size)
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "file is %lld bytes, header says %llu",
                        (long long)st.st_size, (unsigned long long)h->pool_size);
    g->uuid = h->uuid;
    return 0;
}

RTK_EXPORT int rtkit_pmem_open(const char *path, const rtkit_pmem_options *opts, rtkit_pmem_pool **out) {
    rtkit_pmem_options d;
    if (!opts) rtkit_pmem_options_init(&d), opts = &d;
    if (!path || !*path || !out) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, path, "path and out are required");
    *out = NULL;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return rtk_fail(RTKIT_PMEM_ESYS, errno, path, "cannot open the pool: %s", strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK) return rtk_fail(RTKIT_PMEM_EBUSY, EBUSY, path, "pool is open in another process");
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
        if (p->pkind != RTKIT_PMEM_PERSIST_NONE) rc = rtkit_pmem_sync(p);
        write_mutable(p, 1);
    }
    unmap_data(p);
    if (p->fd >= 0) close(p->fd);
    pool_release_mem(p);
    return rc;
}

/* ---- recovery: rebuild the volatile state from the segment table and record headers ---- */

struct rtk_worker {
    struct rtkit_pmem_pool *p;
    uint64_t s0, s1;
    uint64_t (*lists)[3]; /* per class: head, tail, count */
    uint64_t allocated, req, scanned, changed, errors;
    int64_t *cls_alloc;   /* per class live records */
    int64_t *cls_req;
    uint64_t lists_len;
};

static void *recover_worker(void *arg) {
    struct rtk_worker *w = arg;
    struct rtkit_pmem_pool *p = w->p;
    const struct rtk_geom *g = &p->g;
    for (uint64_t s = w->s0; s < w->s1; s++) {
        uint64_t v = p->vseg[s];
        if (SEG_KIND(v) != RTK_SEG_CLASS) continue;
        unsigned c = SEG_CLS(v);
        uint32_t gen = SEG_GEN(v);
        uint32_t rs = rtk_rs(g, c);
        uint64_t ns = rtk_nslots(g, c), soff = rtk_seg_off(g, s);
        char *sb = p->base + soff;
        uint64_t next_unlinked = 0; /* slots [next_unlinked, i) are free and not yet linked */
        uint64_t live = 0;
        for (uint64_t i = 0; i < ns; i++) {
            struct rtk_rec *r = (struct rtk_rec *)(sb + i * rs);
            uint64_t word = atomic_load_explicit(&r->word, memory_order_relaxed);
            if (REC_STATE(word) != RTK_REC_ALLOC) continue;
            uint64_t off = soff + i * rs + RTK_HDR;
            if (atomic_load_explicit(&r->check, memory_order_relaxed) != rtk_rec_check(word, off, gen, g->uuid))
                continue; /* torn: its alloc never returned */
            if (REC_CLS(word) != c) {
                w->errors++;
                continue;
            }
            live++;
            w->cls_req[c] += (int64_t)REC_SIZE(word);
            for (uint64_t j = next_unlinked; j < i; j++) {
                char *fr = sb + j * rs;
                *(void **)(fr + RTK_HDR) = (void *)(uintptr_t)w->lists[c][0];
                if (!w->lists[c][0]) w->lists[c][1] = (uint64_t)(uintptr_t)fr;
                w->lists[c][0] = (uint64_t)(uintptr_t)fr;
                w->lists[c][2]++;
            }
            next_unlinked = i + 1;
        }
        w->scanned += g->seg_size;
        if (live == 0) {
            /* nothing lives here: the segment goes back to the free set (gen kept, bumped on reuse) */
            uint64_t e = rtk_seg_entry(RTK_SEG_FREE, 0, gen, s, g->uuid);
            atomic_store(&p->segtab[s], e);
            p->vseg[s] = e;
            w->changed++;
            continue;
        }
        w->allocated += live;
        w->cls_alloc[c] += (int64_t)live;
        if (next_unlinked < ns) {
            struct rtk_cpool *cp = &p->cp[c];
            rtk_spin_lock(&cp->lock);
            rtk_vstack_push(&cp->partials, s, next_unlinked, 0);
            rtk_spin_unlock(&cp->lock);
        }
    }
    return NULL;
}

int rtk_recover(struct rtkit_pmem_pool *p) {
    const struct rtk_geom *g = &p->g;
    uint64_t t0 = now_ns();
    /* pass 1 (read only): every entry's checksum, extents and their ranges */
    for (uint64_t s = 0; s < g->nsegs; s++) {
        uint64_t e = atomic_load(&p->segtab[s]);
        if (!rtk_seg_entry_ok(e, s, g->uuid))
            return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path, "segment %llu: table entry checksum mismatch",
                            (unsigned long long)s);
        unsigned k = SEG_KIND(e);
        if (k > RTK_SEG_EXTENT || (k == RTK_SEG_CLASS && (SEG_CLS(e) < g->cmin || SEG_CLS(e) > g->ncls)))
            return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path, "segment %llu: bad kind %u / class %u",
                            (unsigned long long)s, k, SEG_CLS(e));
        p->vseg[s] = e;
    }
    uint64_t ext_changed = 0;
    for (uint64_t s = 0; s < g->nsegs; s++) {
        uint64_t e = p->vseg[s];
        if (SEG_KIND(e) != RTK_SEG_EXTENT) continue;
        uint64_t off = rtk_seg_off(g, s);
        struct rtk_rec *r = (struct rtk_rec *)(p->base + off);
        uint64_t word = atomic_load(&r->word);
        int live = REC_STATE(word) == RTK_REC_ALLOC && REC_CLS(word) == 0 &&
                   atomic_load(&r->check) == rtk_rec_check(word, off + RTK_HDR, SEG_GEN(e), g->uuid);
        uint64_t n = live ? (REC_SIZE(word) + RTK_HDR + g->seg_size - 1) / g->seg_size : 0;
        if (live && s + n > g->nsegs)
            return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path, "extent at segment %llu runs past the pool",
                            (unsigned long long)s);
        for (uint64_t t = s + 1; live && t < s + n; t++)
            if (SEG_KIND(p->vseg[t]) != RTK_SEG_FREE)
                return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path,
                                "extent at segment %llu overlaps segment %llu in use", (unsigned long long)s,
                                (unsigned long long)t);
        if (!live) {
            ext_changed++;
            continue;
        }
        for (uint64_t t = s + 1; t < s + n; t++) p->vseg[t] = RTK_SEG_TAIL;
        p->ext_count++;
        p->ext_bytes += n * g->seg_size;
        p->ext_req += REC_SIZE(word);
        s += n - 1;
    }
    /* pass 2 (writes): extents whose allocation never returned are freed */
    if (ext_changed) {
        for (uint64_t s = 0; s < g->nsegs; s++) {
            uint64_t e = p->vseg[s];
            if (SEG_KIND(e) != RTK_SEG_EXTENT) continue;
            struct rtk_rec *r = (struct rtk_rec *)(p->base + rtk_seg_off(g, s));
            uint64_t word = atomic_load(&r->word);
            if (REC_STATE(word) == RTK_REC_ALLOC && REC_CLS(word) == 0 &&
                atomic_load(&r->check) == rtk_rec_check(word, rtk_seg_off(g, s) + RTK_HDR, SEG_GEN(e), g->uuid))
                continue;
            e = rtk_seg_entry(RTK_SEG_FREE, 0, SEG_GEN(e), s, g->uuid);
            atomic_store(&p->segtab[s], e);
            p->vseg[s] = e;
        }
    }
    /* pass 3: class segments in parallel */
    int nt = p->recovery_threads;
    uint64_t nclass = 0;
    for (uint64_t s = 0; s < g->nsegs; s++) nclass += SEG_KIND(p->vseg[s]) == RTK_SEG_CLASS;
    if ((uint64_t)nt > nclass / 4 + 1) nt = (int)(nclass / 4 + 1);
    size_t per = ((size_t)g->ncls + 1) * (24 + 16);
    size_t scratch_len = ((size_t)nt * (sizeof(struct rtk_worker) + per) + 4095) & ~(size_t)4095;
    char *scratch = rtk_map_anon(scratch_len);
    if (!scratch) return rtk_fail(RTKIT_PMEM_ESYS, ENOMEM, p->path, "out of memory for recovery");
    struct rtk_worker *ws = (struct rtk_worker *)scratch;
    char *cur = scratch + (size_t)nt * sizeof(struct rtk_worker);
    pthread_t tids[64];
    int started[64] = {0};
    for (int i = 0; i < nt; i++) {
        ws[i].p = p;
        ws[i].s0 = g->nsegs * i / nt;
        ws[i].s1 = g->nsegs * (i + 1) / nt;
        ws[i].lists = (uint64_t(*)[3])cur;
        cur += ((size_t)g->ncls + 1) * 24;
        ws[i].cls_alloc = (int64_t *)cur;
        cur += ((size_t)g->ncls + 1) * 8;
        ws[i].cls_req = (int64_t *)cur;
        cur += ((size_t)g->ncls + 1) * 8;
        if (i > 0 && i < 64) started[i] = pthread_create(&tids[i], NULL, recover_worker, &ws[i]) == 0;
    }
    recover_worker(&ws[0]);
    for (int i = 1; i < nt; i++) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            recover_worker(&ws[i]);
    }
    uint64_t errors = 0, changed = ext_changed;
    for (int i = 0; i < nt; i++) {
        errors += ws[i].errors;
        changed += ws[i].changed;
        p->recovered_records += ws[i].allocated;
        p->recovered_scanned += ws[i].scanned;
        for (uint32_t c = 1; c <= g->ncls; c++) {
            p->cp[c].allocs += ws[i].cls_alloc[c];
            p->cp[c].req += ws[i].cls_req[c];
            if (ws[i].lists[c][2]) {
                rtk_vstack_push(&p->cp[c].chains, ws[i].lists[c][0], ws[i].lists[c][1], ws[i].lists[c][2]);
                p->cp[c].free_count += ws[i].lists[c][2];
            }
        }
    }
    munmap(scratch, scratch_len);
    if (errors)
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path,
                        "%llu records carry a valid checksum but the wrong class for their segment",
                        (unsigned long long)errors);
    for (uint64_t s = 0; s < g->nsegs; s++) {
        uint64_t v = p->vseg[s];
        if (SEG_KIND(v) == RTK_SEG_FREE)
            p->segs_free++;
        else if (SEG_KIND(v) == RTK_SEG_CLASS)
            p->cp[SEG_CLS(v)].segments++;
    }
    p->recovered_records += p->ext_count;
    if (changed && !p->anonymous) rtk_persist(p, (void *)p->segtab, g->nsegs * 8);
    p->recovery_ns = now_ns() - t0;
    p->recovery_threads_used = (uint32_t)nt;
    return 0;
}
