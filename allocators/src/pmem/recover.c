/* recover.c -- opening a pool rebuilds its volatile state from the segment table and the record headers:
 * extents first, then class segments in parallel; torn allocations are freed. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include "pmem/pool.h"

struct rtk_worker {
    struct rtkit_pmem_pool *p;
    uint64_t s0, s1;
    uint64_t (*lists)[3]; /* per class: head, tail, count */
    uint64_t allocated, req, scanned, changed, errors, corrupt, corrupt_off;
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
            uint64_t off = soff + i * rs + RTK_HDR;
            if (REC_STATE(word) != RTK_REC_ALLOC) {
                /* free, a torn write (pmem_internal.h), or, in no known state, corruption */
                if (g->strict && word != 0 && REC_STATE(word) != RTK_REC_FREE) {
                    if (!w->corrupt++) w->corrupt_off = off;
                    next_unlinked = i + 1; /* never linked: its bytes stay as they are */
                }
                continue;
            }
            if (atomic_load_explicit(&r->check, memory_order_relaxed) != rtk_rec_check(word, off, gen, g->uuid)) {
                if (g->strict) { /* an ALLOC word is written last: a failing check is a changed header */
                    if (!w->corrupt++) w->corrupt_off = off;
                    live++;      /* the segment is not freed, the record never linked */
                    next_unlinked = i + 1;
                }
                continue; /* version 1: torn, its alloc never returned */
            }
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
            /* (written to the table after the whole pool passed its checks: rtk_recover) */
            p->vseg[s] = rtk_seg_entry(RTK_SEG_FREE, 0, gen, s, g->uuid);
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

void rtk_write_summaries(struct rtkit_pmem_pool *p) {
    const struct rtk_geom *g = &p->g;
    struct rtk_sum *sums = (struct rtk_sum *)(p->base + g->sum_off);
    for (uint64_t s = 0; s < g->nsegs; s++) rtk_seg_summary(g, p->base, atomic_load(&p->segtab[s]), s, &sums[s]);
}

/* a cleanly closed pool: every segment's live records as its summary says (pmem_internal.h), before any change */
static int verify_summaries(struct rtkit_pmem_pool *p) {
    const struct rtk_geom *g = &p->g;
    const struct rtk_sum *sums = (const struct rtk_sum *)(p->base + g->sum_off);
    for (uint64_t s = 0; s < g->nsegs; s++) {
        struct rtk_sum now;
        rtk_seg_summary(g, p->base, p->vseg[s], s, &now);
        if (now.live != sums[s].live || now.hash != sums[s].hash)
            return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path,
                            "segment %llu: %llu live record(s) found, the summary of the last clean close says %llu "
                            "(a record header, the segment or its summary changed); the pool was not changed: run "
                            "`rtkit pmem check`", (unsigned long long)s, (unsigned long long)now.live,
                            (unsigned long long)sums[s].live);
    }
    return 0;
}

int rtk_recover(struct rtkit_pmem_pool *p) {
    const struct rtk_geom *g = &p->g;
    uint64_t t0 = rtk_now_ns();
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
    if (p->was_clean) {
        int rc = verify_summaries(p);
        if (rc) return rc;
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
        if (!live && g->strict && (word != 0 || atomic_load(&r->check) != 0) && REC_STATE(word) != RTK_REC_FREE)
            /* the header is complete before the entry says "extent", and a free writes FREE first: anything
             * else in an extent's header is a changed header, and its data must not be given away */
            return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path,
                            "extent at segment %llu: record header corrupt (offset %llu); the pool was not changed: "
                            "run `rtkit pmem check`", (unsigned long long)s, (unsigned long long)(off + RTK_HDR));
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
    uint64_t corrupt = 0, corrupt_off = 0;
    for (int i = 0; i < nt; i++)
        if (ws[i].corrupt) {
            if (!corrupt) corrupt_off = ws[i].corrupt_off;
            corrupt += ws[i].corrupt;
        }
    rtk_os_unmap(scratch, scratch_len);
    if (corrupt)
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path,
                        "%llu record header(s) corrupt (first at offset %llu); the pool was not changed: "
                        "run `rtkit pmem check`", (unsigned long long)corrupt, (unsigned long long)corrupt_off);
    if (errors)
        return rtk_fail(RTKIT_PMEM_ECORRUPT, EINVAL, p->path,
                        "%llu records carry a valid checksum but the wrong class for their segment",
                        (unsigned long long)errors);
    /* writes, now that every check passed. The clean flag goes first: from the first change on, the summaries
     * of the last clean close are stale, and a kill before the next clean close must not leave them trusted */
    if (!p->anonymous) rtk_write_mutable(p, 0);
    /* extents whose allocation never returned are freed */
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
    for (uint64_t s = 0; s < g->nsegs; s++) /* class segments with no live record go back to the free set */
        if (SEG_KIND(p->vseg[s]) == RTK_SEG_FREE && atomic_load(&p->segtab[s]) != p->vseg[s])
            atomic_store(&p->segtab[s], p->vseg[s]);
    for (uint64_t s = 0; s < g->nsegs; s++) {
        uint64_t v = p->vseg[s];
        if (SEG_KIND(v) == RTK_SEG_FREE)
            p->segs_free++;
        else if (SEG_KIND(v) == RTK_SEG_CLASS)
            p->cp[SEG_CLS(v)].segments++;
    }
    p->recovered_records += p->ext_count;
    if (changed && !p->anonymous) rtk_persist(p, (void *)p->segtab, g->nsegs * 8);
    p->recovery_ns = rtk_now_ns() - t0;
    p->recovery_threads_used = (uint32_t)nt;
    return 0;
}
