/* alloc.c -- PMEM pool allocation paths: records from thread caches and shared pools, segments, extents. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include "pmem/cache.h"

#define NEXT_OF(rec) (*(char **)((rec) + RTK_HDR))

/* ---- segments ---- */

/* Segments under seg_lock. Runs of up to TOP_RUN_MAX segments (class segments, small extents) are taken from the
 * top of the pool down, longer ones from the bottom up: small records gather at the top and leave the rest one run,
 * so a table-sized extent finds room beside them. Taken next-fit, they spread over the pool and split it: a 1 GiB
 * pool holding 494 MiB refused a 244 MiB table, a 128 MiB pool holding 6 MiB a 73 MiB one. */
#define TOP_RUN_MAX 16

static int64_t seg_take_run(struct rtkit_pmem_pool *p, uint64_t n) {
    uint64_t N = p->g.nsegs;
    if (p->segs_free < n) return -1;
    uint64_t run = 0;
    if (n <= TOP_RUN_MAX) {
        int skipped = 0; /* a free segment above the run: the top stays to be searched */
        for (uint64_t s = N - p->segs_top_used; s-- > 0;) {
            if (SEG_KIND(p->vseg[s]) != RTK_SEG_FREE) {
                skipped |= run > 0;
                run = 0;
                continue;
            }
            if (++run == n) {
                if (!skipped) p->segs_top_used = N - s;
                return (int64_t)s;
            }
        }
        return -1;
    }
    for (uint64_t s = 0; s < N; s++) {
        run = SEG_KIND(p->vseg[s]) == RTK_SEG_FREE ? run + 1 : 0;
        if (run == n) return (int64_t)(s + 1 - n);
    }
    return -1;
}

/* segments [s, s + n) are free again: a class search must look at them */
static void seg_freed(struct rtkit_pmem_pool *p, uint64_t s, uint64_t n) {
    uint64_t above = p->g.nsegs - (s + n);
    if (p->segs_top_used > above) p->segs_top_used = above;
}

/* a fresh segment for class c, its table entry persisted before any record in it can be handed out */
static int64_t seg_new_class(struct rtkit_pmem_pool *p, unsigned c) {
    pthread_mutex_lock(&p->seg_lock);
    int64_t s = seg_take_run(p, 1);
    if (s < 0) {
        pthread_mutex_unlock(&p->seg_lock);
        return -1;
    }
    uint32_t gen = (SEG_GEN(p->vseg[s]) + 1) & 0xffffff;
    uint64_t e = rtk_seg_entry(RTK_SEG_CLASS, c, gen ? gen : 1, (uint64_t)s, p->g.uuid);
    p->vseg[s] = e;
    p->segs_free--;
    pthread_mutex_unlock(&p->seg_lock);
    /* the old bytes of a reused segment are no headers of this layout: zero them before the entry says
     * "class", so recovery reads only headers this incarnation wrote (pmem_internal.h) */
    char *sb = p->base + rtk_seg_off(&p->g, (uint64_t)s);
    uint32_t rs = rtk_rs(&p->g, c);
    uint64_t ns = rtk_nslots(&p->g, c);
    for (uint64_t i = 0; i < ns; i++) memset(sb + i * rs, 0, RTK_HDR);
    if (p->durable) rtk_persist(p, sb, p->g.seg_size);
    atomic_store(&p->segtab[s], e);
    if (p->durable) rtk_persist(p, (void *)&p->segtab[s], 8);
    __atomic_fetch_add(&p->cp[c].segments, 1, __ATOMIC_RELAXED);
    return s;
}

/* ---- record classes ---- */

static inline char *tc_pop(struct rtk_tclass *t) {
    char *r = t->head;
    if (r) {
        t->head = NEXT_OF(r);
        if (!t->head) t->tail = NULL;
        __atomic_store_n(&t->count, t->count - 1, __ATOMIC_RELAXED); /* the background thread peeks at it */
    }
    return r;
}

static inline void tc_push(struct rtk_tclass *t, char *r) {
    NEXT_OF(r) = t->head;
    if (!t->head) t->tail = r;
    t->head = r;
    __atomic_store_n(&t->count, t->count + 1, __ATOMIC_RELAXED);
}

static inline char *tc_bump(struct rtkit_pmem_pool *p, struct rtk_tclass *t, unsigned c) {
    if (t->seg == UINT64_MAX || t->next >= t->nslots) return NULL;
    return p->base + rtk_seg_off(&p->g, t->seg) + (t->next++) * (uint64_t)rtk_rs(&p->g, c);
}

/* pop an entry of one of a class pool's stacks; the unlocked peek first spares the lock when it is empty.
   A chain's records leave the pool's free count with it. */
static int cp_pop(struct rtk_cpool *cp, struct rtk_vstack *st, uint64_t e[3]) {
    if (!__atomic_load_n(&st->n, __ATOMIC_RELAXED)) return 0;
    rtk_spin_lock(&cp->lock);
    int got = rtk_vstack_pop(st, e);
    if (got && st == &cp->chains) cp->free_count -= e[2];
    rtk_spin_unlock(&cp->lock);
    return got;
}

/* take a chain of free records from the shared pool into the (empty) thread list */
static char *pool_chain(struct rtkit_pmem_pool *p, struct rtk_tclass *t, unsigned c) {
    struct rtk_cpool *cp = &p->cp[c];
    uint64_t e[3];
    if (!cp_pop(cp, &cp->chains, e)) return NULL;
    if (t->count) { /* append (only on the larger-class path, where t may hold records) */
        NEXT_OF((char *)(uintptr_t)e[1]) = t->head;
        t->head = (char *)(uintptr_t)e[0];
        __atomic_store_n(&t->count, t->count + e[2], __ATOMIC_RELAXED);
    } else {
        t->head = (char *)(uintptr_t)e[0];
        t->tail = (char *)(uintptr_t)e[1];
        __atomic_store_n(&t->count, e[2], __ATOMIC_RELAXED);
    }
    return tc_pop(t);
}

static void retire_current(struct rtkit_pmem_pool *p, struct rtk_tclass *t, unsigned c) {
    if (t->seg != UINT64_MAX && t->next < t->nslots) {
        struct rtk_cpool *cp = &p->cp[c];
        rtk_spin_lock(&cp->lock);
        rtk_vstack_push(&cp->partials, t->seg, t->next, 0);
        rtk_spin_unlock(&cp->lock);
    }
    t->seg = UINT64_MAX;
}

static char *pool_partial(struct rtkit_pmem_pool *p, struct rtk_tclass *t, unsigned c) {
    struct rtk_cpool *cp = &p->cp[c];
    uint64_t e[3];
    if (!cp_pop(cp, &cp->partials, e)) return NULL;
    retire_current(p, t, c);
    t->seg = e[0];
    t->next = e[1];
    t->nslots = rtk_nslots(&p->g, c);
    return tc_bump(p, t, c);
}

static char *class_new_segment(struct rtkit_pmem_pool *p, struct rtk_tclass *t, unsigned c) {
    int64_t s = seg_new_class(p, c);
    if (s < 0) return NULL;
    retire_current(p, t, c);
    t->seg = (uint64_t)s;
    t->next = 0;
    t->nslots = rtk_nslots(&p->g, c);
    return tc_bump(p, t, c);
}

/* DeepRec's order: own list, shared pool, own segment, a new segment, then a larger class */
static char *class_alloc(struct rtkit_pmem_pool *p, struct rtk_tcache *tc, unsigned c, unsigned *got_cls) {
    struct rtk_tclass *t = &tc->cls[c];
    char *r = tc_pop(t);
    if (LIKELY(r != NULL)) goto done;
    if ((r = pool_chain(p, t, c))) goto done;
    if ((r = tc_bump(p, t, c))) goto done;
    if ((r = pool_partial(p, t, c))) goto done;
    if ((r = class_new_segment(p, t, c))) goto done;
    for (unsigned k = c + 1; k <= p->g.ncls; k++) {
        struct rtk_tclass *u = &tc->cls[k];
        if ((r = tc_pop(u)) || (r = pool_chain(p, u, k)) || (r = tc_bump(p, u, k)) || (r = pool_partial(p, u, k))) {
            c = k;
            goto done;
        }
    }
    return NULL;
done:
    *got_cls = c;
    return r;
}

static inline void write_header(struct rtkit_pmem_pool *p, char *rec, uint64_t word, uint32_t gen) {
    struct rtk_rec *h = (struct rtk_rec *)rec;
    uint64_t off = (uint64_t)(rec - p->base) + RTK_HDR;
    /* commit order (pmem_internal.h): the check first, the ALLOC word last */
    atomic_store_explicit(&h->check, rtk_rec_check(word, off, gen, p->g.uuid), memory_order_relaxed);
    atomic_store_explicit(&h->word, word, memory_order_release);
    if (p->durable) rtk_persist(p, rec, RTK_HDR);
}

static inline uint32_t gen_of(struct rtkit_pmem_pool *p, const char *rec) {
    return SEG_GEN(p->vseg[rtk_seg_index(&p->g, (uint64_t)(rec - p->base))]);
}

static int extent_alloc(struct rtkit_pmem_pool *p, uint64_t nbytes, uint64_t *handle) {
    uint64_t n = (nbytes + RTK_HDR + p->g.seg_size - 1) / p->g.seg_size;
    if (nbytes > RTK_MAX_REQUEST || n > p->g.nsegs)
        return rtk_fail(RTKIT_PMEM_ETOOBIG, EFBIG, p->path, "allocation of %llu bytes is above the largest extent (%llu)",
                        (unsigned long long)nbytes, (unsigned long long)(p->g.nsegs * p->g.seg_size - RTK_HDR));
    pthread_mutex_lock(&p->seg_lock);
    int64_t s = seg_take_run(p, n);
    if (s < 0) {
        pthread_mutex_unlock(&p->seg_lock);
        return rtk_fail(RTKIT_PMEM_ENOSPC, ENOSPC, p->path, "no run of %llu free segments for %llu bytes",
                        (unsigned long long)n, (unsigned long long)nbytes);
    }
    uint32_t gen = (SEG_GEN(p->vseg[s]) + 1) & 0xffffff;
    uint64_t e = rtk_seg_entry(RTK_SEG_EXTENT, 0, gen ? gen : 1, (uint64_t)s, p->g.uuid);
    p->vseg[s] = e;
    for (uint64_t t = 1; t < n; t++) p->vseg[s + t] = RTK_SEG_TAIL;
    p->segs_free -= n;
    p->ext_count++;
    p->ext_bytes += n * p->g.seg_size;
    p->ext_req += nbytes;
    pthread_mutex_unlock(&p->seg_lock);
    /* the header is complete before the table entry says "extent": a crash in between leaves a free segment */
    char *rec = p->base + rtk_seg_off(&p->g, (uint64_t)s);
    write_header(p, rec, REC_WORD(0, RTK_REC_ALLOC, nbytes), SEG_GEN(e));
    atomic_store(&p->segtab[s], e);
    if (p->durable) rtk_persist(p, (void *)&p->segtab[s], 8);
    *handle = (uint64_t)(rec - p->base) + RTK_HDR;
    return 0;
}

RTK_EXPORT int rtkit_pmem_alloc(rtkit_pmem_pool *p, uint64_t nbytes, uint64_t *handle) {
    if (UNLIKELY(!p || !handle)) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool and handle are required");
    if (nbytes == 0) nbytes = 1;
    if (UNLIKELY(nbytes > p->g.max_record)) return extent_alloc(p, nbytes, handle);
    unsigned c = (unsigned)((nbytes + RTK_HDR + p->g.block - 1) >> p->g.shift);
    if (c < p->g.cmin) c = p->g.cmin;
    struct rtk_tcache *tc = rtk_tcache_get(p);
    if (UNLIKELY(!tc)) return rtk_fail(RTKIT_PMEM_ESYS, ENOMEM, p->path, "no memory for a thread cache");
    rtk_tc_enter(p, tc);
    unsigned got;
    char *rec = class_alloc(p, tc, c, &got);
    if (LIKELY(rec != NULL)) {
        tc->cls[got].allocs++;
        tc->cls[got].req += (int64_t)nbytes;
    }
    rtk_tc_leave(p, tc);
    if (UNLIKELY(!rec))
        return rtk_fail(RTKIT_PMEM_ENOSPC, ENOSPC, p->path, "pool is full (no record of %llu bytes left)",
                        (unsigned long long)nbytes);
    write_header(p, rec, REC_WORD(got, RTK_REC_ALLOC, nbytes), gen_of(p, rec));
    *handle = (uint64_t)(rec - p->base) + RTK_HDR;
    return 0;
}

/* locate and validate the record of a handle: kind of segment, class, header pointer */
static int locate(struct rtkit_pmem_pool *p, uint64_t h, char **rec_out, unsigned *cls, uint64_t *seg) {
    const struct rtk_geom *g = &p->g;
    if (h < g->data_off + RTK_HDR || h >= g->size || (h & 7))
        return rtk_fail(RTKIT_PMEM_EBADHANDLE, EINVAL, p->path, "handle %llu is outside the pool's records",
                        (unsigned long long)h);
    uint64_t s = rtk_seg_index(g, h - RTK_HDR);
    uint64_t v = p->vseg[s], in = h - RTK_HDR - rtk_seg_off(g, s);
    if (SEG_KIND(v) == RTK_SEG_CLASS) {
        /* no division to test that h starts a slot: the header checksum covers the offset, so a handle
         * into the middle of a record finds no valid header there (the caller checks it) */
        *cls = SEG_CLS(v);
    } else if (SEG_KIND(v) == RTK_SEG_EXTENT && in == 0) {
        *cls = 0;
    } else {
        return rtk_fail(RTKIT_PMEM_EBADHANDLE, EINVAL, p->path, "handle %llu is not in a segment in use",
                        (unsigned long long)h);
    }
    *rec_out = p->base + h - RTK_HDR;
    *seg = s;
    return 0;
}

RTK_EXPORT int rtkit_pmem_free(rtkit_pmem_pool *p, uint64_t h) {
    if (UNLIKELY(!p)) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool is NULL");
    char *rec;
    unsigned c;
    uint64_t s;
    int rc = locate(p, h, &rec, &c, &s);
    if (rc) return rc;
    struct rtk_rec *hd = (struct rtk_rec *)rec;
    uint32_t gen = SEG_GEN(p->vseg[s]);
    uint64_t w = atomic_load_explicit(&hd->word, memory_order_acquire);
    uint64_t chk = atomic_load_explicit(&hd->check, memory_order_relaxed);
    int valid = chk == rtk_rec_check(w, h, gen, p->g.uuid);
    if (REC_STATE(w) != RTK_REC_ALLOC || !valid) {
        /* free, with the check of either state: a concurrent free may not have rewritten it yet */
        if (REC_STATE(w) == RTK_REC_FREE &&
            (valid || chk == rtk_rec_check(REC_WORD(REC_CLS(w), RTK_REC_ALLOC, REC_SIZE(w)), h, gen, p->g.uuid)))
            return rtk_fail(RTKIT_PMEM_EDOUBLEFREE, EINVAL, p->path, "double free of handle %llu",
                            (unsigned long long)h);
        return rtk_fail(RTKIT_PMEM_EBADHANDLE, EINVAL, p->path, "handle %llu is not an allocated record",
                        (unsigned long long)h);
    }
    uint64_t nw = REC_WORD(REC_CLS(w), RTK_REC_FREE, REC_SIZE(w));
    if (p->durable) {
        /* two threads freeing the same record at the same instant: exactly one wins */
        if (!atomic_compare_exchange_strong(&hd->word, &w, nw))
            return rtk_fail(RTKIT_PMEM_EDOUBLEFREE, EINVAL, p->path, "double free of handle %llu (concurrent)",
                            (unsigned long long)h);
    } else {
        /* volatile mode saves the locked instruction: sequential double frees are still caught above */
        atomic_store_explicit(&hd->word, nw, memory_order_relaxed);
    }
    atomic_store_explicit(&hd->check, rtk_rec_check(nw, h, gen, p->g.uuid), memory_order_release);
    if (p->durable) rtk_persist(p, rec, RTK_HDR);
    if (c == 0) {
        uint64_t n = (REC_SIZE(w) + RTK_HDR + p->g.seg_size - 1) / p->g.seg_size;
        uint64_t e = rtk_seg_entry(RTK_SEG_FREE, 0, gen, s, p->g.uuid);
        atomic_store(&p->segtab[s], e);
        if (p->durable) rtk_persist(p, (void *)&p->segtab[s], 8);
        pthread_mutex_lock(&p->seg_lock);
        p->vseg[s] = e;
        for (uint64_t t = 1; t < n; t++) p->vseg[s + t] = 0;
        p->segs_free += n;
        seg_freed(p, s, n);
        p->ext_count--;
        p->ext_bytes -= n * p->g.seg_size;
        p->ext_req -= REC_SIZE(w);
        pthread_mutex_unlock(&p->seg_lock);
        return 0;
    }
    struct rtk_tcache *tc = rtk_tcache_get(p);
    if (UNLIKELY(!tc)) { /* no cache: give the record straight to the shared pool */
        struct rtk_cpool *cp = &p->cp[c];
        NEXT_OF(rec) = NULL;
        rtk_spin_lock(&cp->lock);
        rtk_vstack_push(&cp->chains, (uintptr_t)rec, (uintptr_t)rec, 1);
        cp->free_count++;
        cp->allocs--;
        cp->req -= (int64_t)REC_SIZE(w);
        rtk_spin_unlock(&cp->lock);
        return 0;
    }
    rtk_tc_enter(p, tc);
    struct rtk_tclass *t = &tc->cls[c];
    tc_push(t, rec);
    t->allocs--;
    t->req -= (int64_t)REC_SIZE(w);
    rtk_tc_leave(p, tc);
    return 0;
}

RTK_EXPORT void *rtkit_pmem_ptr(rtkit_pmem_pool *p, uint64_t h) { return h ? p->base + h : NULL; }
RTK_EXPORT void *rtkit_pmem_base(rtkit_pmem_pool *p) { return p->base; }
RTK_EXPORT uint64_t rtkit_pmem_handle(rtkit_pmem_pool *p, const void *ptr) {
    const char *c = ptr;
    return (c >= p->base + p->g.data_off && c < p->base + p->g.size) ? (uint64_t)(c - p->base) : 0;
}

static int live_record(struct rtkit_pmem_pool *p, uint64_t h, uint64_t *req, uint64_t *usable) {
    char *rec;
    unsigned c;
    uint64_t s;
    int rc = locate(p, h, &rec, &c, &s);
    if (rc) return rc;
    struct rtk_rec *hd = (struct rtk_rec *)rec;
    uint64_t w = atomic_load(&hd->word);
    if (REC_STATE(w) != RTK_REC_ALLOC || atomic_load(&hd->check) != rtk_rec_check(w, h, SEG_GEN(p->vseg[s]), p->g.uuid))
        return rtk_fail(RTKIT_PMEM_EBADHANDLE, EINVAL, p->path, "handle %llu is not an allocated record",
                        (unsigned long long)h);
    if (req) *req = REC_SIZE(w);
    if (usable) {
        if (c)
            *usable = rtk_rs(&p->g, c) - RTK_HDR;
        else
            *usable = (REC_SIZE(w) + RTK_HDR + p->g.seg_size - 1) / p->g.seg_size * p->g.seg_size - RTK_HDR;
    }
    return 0;
}

RTK_EXPORT int rtkit_pmem_record_size(rtkit_pmem_pool *p, uint64_t h, uint64_t *requested, uint64_t *usable) {
    if (!p) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool is NULL");
    return live_record(p, h, requested, usable);
}

RTK_EXPORT int rtkit_pmem_persist(rtkit_pmem_pool *p, uint64_t h, uint64_t offset, uint64_t len) {
    if (!p) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool is NULL");
    uint64_t usable;
    int rc = live_record(p, h, NULL, &usable);
    if (rc) return rc;
    if (offset > usable || len > usable - offset)
        return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, p->path, "range [%llu, +%llu) is outside the record (%llu bytes)",
                        (unsigned long long)offset, (unsigned long long)len, (unsigned long long)usable);
    if (len == 0) len = usable - offset;
    rtk_persist(p, p->base + h + offset, len);
    return 0;
}

RTK_EXPORT int rtkit_pmem_persist_range(rtkit_pmem_pool *p, const void *addr, uint64_t len) {
    if (!p) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool is NULL");
    const char *a = addr;
    if (a < p->base || a + len > p->base + p->g.size || a + len < a)
        return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, p->path, "range is outside the pool");
    rtk_persist(p, addr, len);
    return 0;
}

RTK_EXPORT int rtkit_pmem_next(rtkit_pmem_pool *p, uint64_t after, uint64_t *handle, uint64_t *requested) {
    if (!p || !handle) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool and handle are required");
    const struct rtk_geom *g = &p->g;
    uint64_t s = 0, i = 0;
    if (after) {
        if (after < g->data_off + RTK_HDR || after >= g->size)
            return rtk_fail(RTKIT_PMEM_EBADHANDLE, EINVAL, p->path, "handle %llu is outside the pool",
                            (unsigned long long)after);
        s = rtk_seg_index(g, after - RTK_HDR);
        uint64_t v = p->vseg[s];
        if (SEG_KIND(v) == RTK_SEG_CLASS)
            i = (after - RTK_HDR - rtk_seg_off(g, s)) / rtk_rs(g, SEG_CLS(v)) + 1;
        else
            s++;
    }
    for (; s < g->nsegs; s++, i = 0) {
        uint64_t v = p->vseg[s];
        uint32_t gen = SEG_GEN(v);
        if (SEG_KIND(v) == RTK_SEG_EXTENT) {
            if (i) continue;
            uint64_t h = rtk_seg_off(g, s) + RTK_HDR;
            struct rtk_rec *r = (struct rtk_rec *)(p->base + h - RTK_HDR);
            uint64_t w = atomic_load(&r->word);
            if (REC_STATE(w) == RTK_REC_ALLOC && atomic_load(&r->check) == rtk_rec_check(w, h, gen, g->uuid)) {
                *handle = h;
                if (requested) *requested = REC_SIZE(w);
                return 0;
            }
            continue;
        }
        if (SEG_KIND(v) != RTK_SEG_CLASS) continue;
        unsigned c = SEG_CLS(v);
        uint32_t rs = rtk_rs(g, c);
        uint64_t ns = rtk_nslots(g, c);
        for (; i < ns; i++) {
            uint64_t h = rtk_seg_off(g, s) + i * rs + RTK_HDR;
            struct rtk_rec *r = (struct rtk_rec *)(p->base + h - RTK_HDR);
            uint64_t w = atomic_load_explicit(&r->word, memory_order_relaxed);
            if (REC_STATE(w) == RTK_REC_ALLOC && atomic_load(&r->check) == rtk_rec_check(w, h, gen, g->uuid)) {
                *handle = h;
                if (requested) *requested = REC_SIZE(w);
                return 0;
            }
        }
    }
    *handle = 0;
    return 0;
}
