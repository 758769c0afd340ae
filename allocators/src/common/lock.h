/* lock.h -- a small test-and-test-and-set spinlock for short critical sections inside the allocators. */
#ifndef RTK_COMMON_LOCK_H
#define RTK_COMMON_LOCK_H

#include <sched.h>

static inline void rtk_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

typedef struct { volatile int v; } rtk_spin_t;
#define RTK_SPIN_INIT {0}

static inline void rtk_spin_lock(rtk_spin_t *l)
{
    unsigned spins = 0;
    while (__atomic_exchange_n(&l->v, 1, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&l->v, __ATOMIC_RELAXED)) {
            if (++spins < 256)
                rtk_cpu_relax();
            else
                sched_yield();  /* the holder may be descheduled: 2 cores, many threads */
        }
    }
}

static inline int rtk_spin_trylock(rtk_spin_t *l)
{
    return !__atomic_exchange_n(&l->v, 1, __ATOMIC_ACQUIRE);
}

static inline void rtk_spin_unlock(rtk_spin_t *l) { __atomic_store_n(&l->v, 0, __ATOMIC_RELEASE); }
/* after fork in the child: only the forking thread exists, so locks are simply reset */
static inline void rtk_spin_reset(rtk_spin_t *l) { l->v = 0; }

#endif
