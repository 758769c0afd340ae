/* cache.h -- per-thread caches of a PMEM pool: the owner's enter/leave (inline, on every alloc and free), their
 * lifetime, and the background rebalancer (cache.c). */
#ifndef RTK_PMEM_CACHE_H
#define RTK_PMEM_CACHE_H
#include "pmem/pool.h"

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Owner/stealer exclusion on a thread cache: the owner thread enters and leaves its cache on every alloc and
 * free; a stealer (the background thread, close) enters rarely. With membarrier the owner needs no atomic read-modify-write: it
 * publishes busy, then looks for a stealer; the stealer publishes stealing, forces a barrier on every
 * thread of the process, then waits for busy to drop. */
static inline void rtk_pause_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline void rtk_tc_enter(struct rtkit_pmem_pool *p, struct rtk_tcache *tc) {
    if (UNLIKELY(!p->asym)) {
        rtk_spin_lock(&tc->lock);
        return;
    }
    for (;;) {
        atomic_store_explicit(&tc->busy, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);
        if (LIKELY(!atomic_load_explicit(&tc->stealing, memory_order_acquire))) return;
        atomic_store_explicit(&tc->busy, 0, memory_order_release);
        while (atomic_load_explicit(&tc->stealing, memory_order_acquire)) rtk_pause_cpu();
    }
}

static inline void rtk_tc_leave(struct rtkit_pmem_pool *p, struct rtk_tcache *tc) {
    if (UNLIKELY(!p->asym)) {
        rtk_spin_unlock(&tc->lock);
        return;
    }
    atomic_store_explicit(&tc->busy, 0, memory_order_release);
}

struct rtk_tcache *rtk_tcache_create(struct rtkit_pmem_pool *p);

static inline struct rtk_tcache *rtk_tcache_get(struct rtkit_pmem_pool *p) {
    struct rtk_tcache *tc = pthread_getspecific(p->key);
    return LIKELY(tc != NULL) ? tc : rtk_tcache_create(p);
}

/* 1 when membarrier(PRIVATE_EXPEDITED) is registered for this process: the owners then pay plain stores */
int rtk_membarrier_register(void);
void rtk_tcache_destructor(void *tc);
void rtk_release_all_tcaches(struct rtkit_pmem_pool *p);
void *rtk_background_main(void *pool);
#endif
