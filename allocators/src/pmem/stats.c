/* stats.c -- a PMEM pool's statistics: per record class, and the whole pool's (rtkit_pmem_stats_get). */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include "pmem/cache.h"

RTK_EXPORT int rtkit_pmem_class_stats_get(rtkit_pmem_pool *p, uint32_t c, rtkit_pmem_class_stats *o) {
    if (!p || !o || c < p->g.cmin || c > p->g.ncls)
        return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, p ? p->path : NULL, "class %u is not in [%u, %u]", c,
                        p ? p->g.cmin : 0, p ? p->g.ncls : 0);
    memset(o, 0, sizeof *o);
    o->cls = c;
    o->record_size = rtk_rs(&p->g, c);
    struct rtk_cpool *cp = &p->cp[c];
    o->segments = __atomic_load_n(&cp->segments, __ATOMIC_RELAXED);
    pthread_mutex_lock(&p->reg_lock);
    rtk_spin_lock(&cp->lock);
    o->allocated = cp->allocs;
    o->free_pool = cp->free_count;
    for (uint64_t i = 0; i < cp->partials.n; i++) o->unused_slots += rtk_nslots(&p->g, c) - cp->partials.e[i][1];
    rtk_spin_unlock(&cp->lock);
    for (struct rtk_tcache *tc = p->tcaches; tc; tc = tc->next) {
        struct rtk_tclass *t = &tc->cls[c];
        o->allocated += __atomic_load_n(&t->allocs, __ATOMIC_RELAXED);
        o->free_threads += __atomic_load_n(&t->count, __ATOMIC_RELAXED);
        if (t->seg != UINT64_MAX && t->next < t->nslots) o->unused_slots += t->nslots - t->next;
    }
    pthread_mutex_unlock(&p->reg_lock);
    return 0;
}

RTK_EXPORT int rtkit_pmem_stats_get(rtkit_pmem_pool *p, rtkit_pmem_stats *o) {
    if (!p || !o) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool and out are required");
    memset(o, 0, sizeof *o);
    const struct rtk_geom *g = &p->g;
    o->pool_size = g->size;
    o->segment_size = g->seg_size;
    o->data_offset = g->data_off;
    o->block_size = g->block;
    o->max_record = g->max_record;
    o->nclasses = g->ncls;
    o->nsegments = (uint32_t)g->nsegs;
    pthread_mutex_lock(&p->seg_lock);
    o->segments_free = p->segs_free;
    o->extents = p->ext_count;
    o->extent_bytes = p->ext_bytes;
    uint64_t ext_req = p->ext_req;
    for (uint64_t s = 0; s < g->nsegs; s++) {
        unsigned k = SEG_KIND(p->vseg[s]);
        if (k == RTK_SEG_CLASS) o->segments_class++;
        else if (k != RTK_SEG_FREE) o->segments_extent++;
    }
    pthread_mutex_unlock(&p->seg_lock);
    int64_t req = (int64_t)ext_req;
    o->allocated_records = o->extents;
    o->allocated_bytes = o->extent_bytes;
    for (uint32_t c = g->cmin; c <= g->ncls; c++) {
        rtkit_pmem_class_stats cs;
        rtkit_pmem_class_stats_get(p, c, &cs);
        o->allocated_records += (uint64_t)(cs.allocated > 0 ? cs.allocated : 0);
        o->allocated_bytes += (uint64_t)(cs.allocated > 0 ? cs.allocated : 0) * cs.record_size;
        o->free_records_pool += cs.free_pool;
        o->free_records_threads += cs.free_threads;
        o->unused_slots += cs.unused_slots;
        pthread_mutex_lock(&p->reg_lock);
        req += p->cp[c].req;
        for (struct rtk_tcache *tc = p->tcaches; tc; tc = tc->next) req += tc->cls[c].req;
        pthread_mutex_unlock(&p->reg_lock);
    }
    o->requested_bytes = (uint64_t)(req > 0 ? req : 0);
    uint64_t used = (o->segments_class + o->segments_extent) * g->seg_size;
    o->fragmentation = used ? 1.0 - (double)o->requested_bytes / (double)used : 0.0;
    o->background_runs = atomic_load(&p->bg_runs);
    o->background_moves = atomic_load(&p->bg_moves);
    o->moved_records = atomic_load(&p->bg_moved);
    o->recovered_records = p->recovered_records;
    o->recovery_ns = p->recovery_ns;
    o->recovered_bytes_scanned = p->recovered_scanned;
    o->recovery_threads = p->recovery_threads_used;
    o->threads_cached = p->nthreads;
    o->durable = p->durable;
    o->persist_kind = p->pkind;
    o->is_pmem = p->is_pmem;
    o->anonymous = p->anonymous;
    o->membarrier = p->asym;
    return 0;
}
