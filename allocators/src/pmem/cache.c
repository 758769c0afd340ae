/* cache.c -- per-thread caches of a PMEM pool (creation, draining at thread exit and close) and the background
 * rebalancer that moves long thread free lists to the shared pools. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <linux/membarrier.h>
#include <time.h>
#include "common/os.h"
#include "pmem/cache.h"

static void tc_steal_begin(struct rtkit_pmem_pool *p, struct rtk_tcache *tc) {
    if (!p->asym) {
        rtk_spin_lock(&tc->lock);
        return;
    }
    atomic_store(&tc->stealing, 1);
    rtk_os_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    unsigned n = 0;
    while (atomic_load_explicit(&tc->busy, memory_order_acquire))
        if (++n % 256 == 0) rtk_os_yield(); else rtk_pause_cpu();
}

static void tc_steal_end(struct rtkit_pmem_pool *p, struct rtk_tcache *tc) {
    if (!p->asym) {
        rtk_spin_unlock(&tc->lock);
        return;
    }
    atomic_store_explicit(&tc->stealing, 0, memory_order_release);
}

int rtk_membarrier_register(void) {
    long cmds = rtk_os_membarrier(MEMBARRIER_CMD_QUERY);
    if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) return 0;
    return rtk_os_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

/* ---- thread caches ---- */

struct rtk_tcache *rtk_tcache_create(struct rtkit_pmem_pool *p) {
    size_t len = sizeof(struct rtk_tcache) + ((size_t)p->g.ncls + 1) * sizeof(struct rtk_tclass);
    len = (len + 4095) & ~(size_t)4095;
    struct rtk_tcache *tc = rtk_map_anon(len);
    if (!tc) return NULL;
    tc->len = len;
    tc->pool = p;
    for (uint32_t c = 0; c <= p->g.ncls; c++) tc->cls[c].seg = UINT64_MAX;
    pthread_mutex_lock(&p->reg_lock);
    tc->next = p->tcaches;
    if (p->tcaches) p->tcaches->prev = tc;
    p->tcaches = tc;
    p->nthreads++;
    pthread_mutex_unlock(&p->reg_lock);
    pthread_setspecific(p->key, tc);
    return tc;
}

/* hand every list, the current segments and the counters of a cache to the shared pools; reg_lock held */
static void tcache_drain_locked(struct rtkit_pmem_pool *p, struct rtk_tcache *tc) {
    tc_steal_begin(p, tc);
    for (uint32_t c = 1; c <= p->g.ncls; c++) {
        struct rtk_tclass *t = &tc->cls[c];
        struct rtk_cpool *cp = &p->cp[c];
        rtk_spin_lock(&cp->lock);
        if (t->count) {
            rtk_vstack_push(&cp->chains, (uintptr_t)t->head, (uintptr_t)t->tail, t->count);
            cp->free_count += t->count;
        }
        if (t->seg != UINT64_MAX && t->next < t->nslots) rtk_vstack_push(&cp->partials, t->seg, t->next, 0);
        cp->allocs += t->allocs;
        cp->req += t->req;
        rtk_spin_unlock(&cp->lock);
        memset(t, 0, sizeof *t);
        t->seg = UINT64_MAX;
    }
    tc_steal_end(p, tc);
    if (tc->prev) tc->prev->next = tc->next;
    else p->tcaches = tc->next;
    if (tc->next) tc->next->prev = tc->prev;
    p->nthreads--;
}

void rtk_tcache_destructor(void *arg) {
    struct rtk_tcache *tc = arg;
    struct rtkit_pmem_pool *p = tc->pool;
    pthread_mutex_lock(&p->reg_lock);
    tcache_drain_locked(p, tc);
    pthread_mutex_unlock(&p->reg_lock);
    rtk_os_unmap(tc, tc->len);
}

RTK_EXPORT void rtkit_pmem_thread_release(rtkit_pmem_pool *p) {
    struct rtk_tcache *tc = pthread_getspecific(p->key);
    if (!tc) return;
    pthread_setspecific(p->key, NULL);
    rtk_tcache_destructor(tc);
}

void rtk_release_all_tcaches(struct rtkit_pmem_pool *p) {
    pthread_mutex_lock(&p->reg_lock);
    while (p->tcaches) {
        struct rtk_tcache *tc = p->tcaches;
        tcache_drain_locked(p, tc);
        rtk_os_unmap(tc, tc->len);
    }
    pthread_mutex_unlock(&p->reg_lock);
}

/* ---- background thread: move long thread lists into the shared pool ---- */

static void rebalance_once(struct rtkit_pmem_pool *p) {
    pthread_mutex_lock(&p->reg_lock);
    for (struct rtk_tcache *tc = p->tcaches; tc; tc = tc->next) {
        int any = 0;
        for (uint32_t c = p->g.cmin; c <= p->g.ncls && !any; c++)
            any = __atomic_load_n(&tc->cls[c].count, __ATOMIC_RELAXED) >= (uint64_t)p->rebalance_min;
        if (!any) continue;
        tc_steal_begin(p, tc);
        for (uint32_t c = p->g.cmin; c <= p->g.ncls; c++) {
            struct rtk_tclass *t = &tc->cls[c];
            uint64_t n = t->count;
            if (n < (uint64_t)p->rebalance_min) continue;
            struct rtk_cpool *cp = &p->cp[c];
            rtk_spin_lock(&cp->lock);
            rtk_vstack_push(&cp->chains, (uintptr_t)t->head, (uintptr_t)t->tail, n);
            cp->free_count += n;
            rtk_spin_unlock(&cp->lock);
            t->head = t->tail = NULL;
            t->count = 0;
            atomic_fetch_add(&p->bg_moves, 1);
            atomic_fetch_add(&p->bg_moved, n);
        }
        tc_steal_end(p, tc);
    }
    pthread_mutex_unlock(&p->reg_lock);
    atomic_fetch_add(&p->bg_runs, 1);
}

RTK_EXPORT int rtkit_pmem_rebalance_now(rtkit_pmem_pool *p) {
    if (!p) return rtk_fail(RTKIT_PMEM_EINVAL, EINVAL, NULL, "pool is NULL");
    rebalance_once(p);
    return 0;
}

void *rtk_background_main(void *arg) {
    struct rtkit_pmem_pool *p = arg;
    pthread_mutex_lock(&p->bg_mu);
    while (!p->bg_stop) {
        uint64_t now = rtk_os_now_ns();  /* the condition variable waits on CLOCK_MONOTONIC (pool.c) */
        struct timespec ts = {(time_t)(now / 1000000000u), (long)(now % 1000000000u)};
        ts.tv_sec += p->rebalance_ms / 1000;
        ts.tv_nsec += (long)(p->rebalance_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&p->bg_cv, &p->bg_mu, &ts);
        if (p->bg_stop) break;
        pthread_mutex_unlock(&p->bg_mu);
        rebalance_once(p);
        pthread_mutex_lock(&p->bg_mu);
    }
    pthread_mutex_unlock(&p->bg_mu);
    return NULL;
}
