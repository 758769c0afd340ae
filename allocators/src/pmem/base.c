/* base.c -- what every part of the PMEM pool shares: error reporting, mmap'ed stacks, geometry, persistence,
 * and the header check used by open and by the offline checker. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef RTK_HAVE_LIBPMEM
#include <libpmem.h>
#endif
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
    return rtk_os_map(len, 0);
}

int rtk_vstack_push(struct rtk_vstack *s, uint64_t a, uint64_t b, uint64_t c) {
    if (s->n == s->cap) {
        uint64_t cap = s->cap ? s->cap * 2 : 4096 / 24;
        void *p = rtk_map_anon(cap * 24);
        if (!p) return -1;
        if (s->e) {
            memcpy(p, s->e, s->n * 24);
            rtk_os_unmap(s->e, s->cap * 24);
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
    if (s->e) rtk_os_unmap(s->e, s->cap * 24);
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
        uint64_t meta = RTK_META_HDR + n * (8 + sizeof(struct rtk_sum));
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
    g->sum_off = RTK_META_HDR + n * 8;
    g->data_off = (g->sum_off + n * sizeof(struct rtk_sum) + seg_size - 1) / seg_size * seg_size;
    g->seg_shift = is_pow2(seg_size) ? (uint32_t)__builtin_ctzll(seg_size) : 0;
    return 0;
}

uint64_t rtk_now_ns(void) { return rtk_os_now_ns(); }

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
        rtk_os_sync_range((void *)a, (uintptr_t)addr + len - a);
        break;
    }
    default:
        /* anonymous memory or tmpfs: executed stores reach the page cache even if the process is killed
         * next, so only the compiler must keep them in program order */
        atomic_signal_fence(memory_order_seq_cst);
        break;
    }
}

/* read and validate a pool header without mapping; shared with the offline checker */
int rtk_read_header(int fd, const char *path, struct rtk_hdr *h, struct rtk_geom *g) {
    rtk_file_info_t st;
    int e = rtk_os_file_info(fd, &st);
    if (e) return rtk_fail(RTKIT_PMEM_ESYS, -e, path, "cannot stat: %s", strerror(-e));
    if (!st.regular) return rtk_fail(RTKIT_PMEM_ENOTPOOL, EINVAL, path, "not a regular file");
    if (st.size < sizeof *h || rtk_os_read_at(fd, h, sizeof *h, 0) != (long)sizeof *h)
        return rtk_fail(RTKIT_PMEM_ENOTPOOL, EINVAL, path, "file too small to be an rtkit pool");
    if (memcmp(h->magic, RTK_MAGIC, 8))
        return rtk_fail(RTKIT_PMEM_ENOTPOOL, EINVAL, path, "not an rtkit pool (bad magic)");
    if (h->version == 1 || h->version == 2)
        return rtk_fail(RTKIT_PMEM_EVERSION, EINVAL, path,
                        "pool format version %u was written by an older rtkit; this one reads version %d (it adds a "
                        "summary of live records that every check and open verifies): copy the records out with the "
                        "rtkit that made the pool, then create a new one", h->version, RTKIT_PMEM_FORMAT_VERSION);
    if (h->version != RTKIT_PMEM_FORMAT_VERSION)
        return rtk_fail(RTKIT_PMEM_EVERSION, EINVAL, path, "pool format version %u, this library reads version %d",
                        h->version, RTKIT_PMEM_FORMAT_VERSION);
    if (h->csum != rtk_hdr_csum(h))
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "pool header checksum mismatch (header corrupt)");
    if (h->hdr_size != sizeof *h)
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "pool header size %u, expected %zu (header corrupt)",
                        h->hdr_size, sizeof *h);
    char why[200];
    if (rtk_geom_compute(g, h->pool_size, h->seg_size, h->block_size, h->max_record, why, sizeof why) ||
        g->nsegs != h->nsegs || g->data_off != h->data_off)
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "pool header geometry is inconsistent");
    if (st.size != h->pool_size)
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "file is %lld bytes, header says %llu",
                        (long long)st.size, (unsigned long long)h->pool_size);
    g->uuid = h->uuid;
    g->strict = h->version >= 2;
    return 0;
}

/* The header's mutable words (open count, clean flag, their checksum): open and recovery clear the flag before
 * their first write, a clean close sets it last. */
void rtk_write_mutable(struct rtkit_pmem_pool *p, int clean) {
    struct rtk_hdr *h = (struct rtk_hdr *)p->base;
    if (!clean) h->open_count++;
    h->clean = (uint64_t)clean;
    h->mcsum = rtk_hdr_mcsum(h);
    rtk_persist(p, &h->open_count, 3 * sizeof(uint64_t));
}
