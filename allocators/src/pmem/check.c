/* check.c -- offline verification and layout report of a pool file; never writes to the pool. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "pmem/pool.h"

static void note(rtkit_pmem_check_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(rtkit_pmem_check_report *r, const char *fmt, ...) {
    if (r->errors++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->first_error, sizeof r->first_error, fmt, ap);
        va_end(ap);
    }
}

/* check and info count the same records; only check needs the pool closed (info may race a writer) */
static int inspect(const char *path, rtkit_pmem_check_report *r, int lock) {
    memset(r, 0, sizeof *r);
    if (!path || !*path) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, path, "path is required");
    int fd = rtk_os_open_nonblock(path, 0); /* never blocks on a FIFO */
    if (fd < 0) return rtk_fail(RTKIT_PMEM_ESYS, -fd, path, "cannot open: %s", strerror(-fd));
    if (lock && rtk_os_lock(fd, 0)) {
        rtk_os_close(fd);
        return rtk_fail(RTKIT_PMEM_EBUSY, EBUSY, path, "pool is open in another process; close it before checking");
    }
    struct rtk_hdr h;
    struct rtk_geom g;
    int rc = rtk_read_header(fd, path, &h, &g);
    if (rc) {
        /* the message without its "PATH: " prefix: the caller names the path once */
        const char *msg = rtkit_pmem_last_error();
        size_t pl = strlen(path);
        if (!strncmp(msg, path, pl) && !strncmp(msg + pl, ": ", 2)) msg += pl + 2;
        snprintf(r->first_error, sizeof r->first_error, "%s", msg);
        r->errors = rc == RTKIT_PMEM_ECORRUPT;
        rtk_os_close(fd);
        return rc;
    }
    r->version = h.version;
    r->block_size = g.block;
    r->max_record = g.max_record;
    r->nclasses = g.ncls;
    r->pool_size = g.size;
    r->segment_size = g.seg_size;
    r->nsegments = g.nsegs;
    r->data_offset = g.data_off;
    r->uuid = g.uuid;
    r->open_count = h.open_count;
    r->clean = h.mcsum == rtk_hdr_mcsum(&h) && h.clean == 1;
    void *mapped;
    int e = rtk_os_map_shared(fd, g.size, 0, &mapped);
    if (e) {
        rtk_os_close(fd);
        return rtk_fail(RTKIT_PMEM_ESYS, -e, path, "cannot map: %s", strerror(-e));
    }
    char *base = mapped;
    const uint64_t *tab = (const uint64_t *)(base + RTK_META_HDR);
    uint64_t tail_until = 0;
    for (uint64_t s = 0; s < g.nsegs; s++) {
        uint64_t e = tab[s];
        if (!rtk_seg_entry_ok(e, s, g.uuid)) {
            note(r, "segment %llu: table entry checksum mismatch", (unsigned long long)s);
            continue;
        }
        unsigned k = SEG_KIND(e);
        if (s < tail_until) {
            if (k != RTK_SEG_FREE) note(r, "segment %llu: in use inside an extent", (unsigned long long)s);
            r->segments_extent++;
            continue;
        }
        uint64_t soff = rtk_seg_off(&g, s);
        if (k == RTK_SEG_FREE) {
            r->segments_free++;
        } else if (k == RTK_SEG_EXTENT) {
            const struct rtk_rec *rec = (const struct rtk_rec *)(base + soff);
            uint64_t w = rec->word;
            if (REC_STATE(w) == RTK_REC_ALLOC && REC_CLS(w) == 0 &&
                rec->check == rtk_rec_check(w, soff + RTK_HDR, SEG_GEN(e), g.uuid)) {
                uint64_t n = (REC_SIZE(w) + RTK_HDR + g.seg_size - 1) / g.seg_size;
                if (s + n > g.nsegs) note(r, "segment %llu: extent runs past the pool", (unsigned long long)s);
                tail_until = s + n;
                r->segments_extent++;
                r->extents++;
                r->extent_bytes += n * g.seg_size;
                r->records_allocated++;
                r->bytes_allocated += n * g.seg_size;
                r->requested_bytes += REC_SIZE(w);
            } else if (g.strict && (w != 0 || rec->check != 0) && REC_STATE(w) != RTK_REC_FREE) {
                note(r, "segment %llu: extent record header corrupt", (unsigned long long)s);
            } else {
                r->segments_free++; /* an extent whose free was cut short: free on open */
                r->records_torn += w != 0;
            }
        } else if (k == RTK_SEG_CLASS) {
            unsigned c = SEG_CLS(e);
            if (c < g.cmin || c > g.ncls) {
                note(r, "segment %llu: class %u out of range", (unsigned long long)s, c);
                continue;
            }
            r->segments_class++;
            uint32_t rs = rtk_rs(&g, c);
            uint64_t ns = rtk_nslots(&g, c);
            for (uint64_t i = 0; i < ns; i++) {
                const struct rtk_rec *rec = (const struct rtk_rec *)(base + soff + i * rs);
                uint64_t w = rec->word;
                if (w == 0) {
                    r->records_free++;
                    continue;
                }
                if (rec->check != rtk_rec_check(w, soff + i * rs + RTK_HDR, SEG_GEN(e), g.uuid)) {
                    /* format 2 writes an ALLOC word last: a failing check beside it is a changed header */
                    if (g.strict && REC_STATE(w) != RTK_REC_FREE) {
                        note(r, "segment %llu slot %llu: record header corrupt (checksum mismatch, state 0x%x)",
                             (unsigned long long)s, (unsigned long long)i, REC_STATE(w));
                        continue;
                    }
                    r->records_torn++;
                    r->records_free++;
                    continue;
                }
                if (REC_STATE(w) == RTK_REC_ALLOC) {
                    if (REC_CLS(w) != c) {
                        note(r, "segment %llu slot %llu: record class %u in a class %u segment", (unsigned long long)s,
                             (unsigned long long)i, REC_CLS(w), c);
                        continue;
                    }
                    r->records_allocated++;
                    r->bytes_allocated += rs;
                    r->requested_bytes += REC_SIZE(w);
                } else if (REC_STATE(w) == RTK_REC_FREE) {
                    r->records_free++;
                } else {
                    note(r, "segment %llu slot %llu: unknown record state 0x%x", (unsigned long long)s,
                         (unsigned long long)i, REC_STATE(w));
                }
            }
        } else {
            note(r, "segment %llu: unknown kind %u", (unsigned long long)s, k);
        }
    }
    if (r->clean) /* a clean close wrote each segment's summary: a record whose header changed cannot hide */
        for (uint64_t s = 0; s < g.nsegs; s++) {
            const struct rtk_sum *want = (const struct rtk_sum *)(base + g.sum_off) + s;
            uint64_t e = tab[s];
            struct rtk_sum now;
            if (!rtk_seg_entry_ok(e, s, g.uuid)) continue; /* said above */
            rtk_seg_summary(&g, base, e, s, &now);
            if (now.live != want->live || now.hash != want->hash)
                note(r, "segment %llu: %llu live record(s) found, the summary of the last clean close says %llu (a "
                     "record header, the segment or its summary changed)", (unsigned long long)s,
                     (unsigned long long)now.live, (unsigned long long)want->live);
        }
    rtk_os_unmap(base, g.size);
    rtk_os_close(fd);
    if (r->errors) {
        rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, path, "%s", r->first_error);
        return RTKIT_PMEM_ECORRUPT;
    }
    return 0;
}

RTK_EXPORT int rtkit_pmem_check(const char *path, rtkit_pmem_check_report *r) { return inspect(path, r, 1); }
RTK_EXPORT int rtkit_pmem_info(const char *path, rtkit_pmem_check_report *r) { return inspect(path, r, 0); }
