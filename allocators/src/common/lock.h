/* lock.h -- a small test-and-test-and-set spinlock for short critical sections inside the allocators. */
#ifndef RTK_COMMON_LOCK_H
#define RTK_COMMON_LOCK_H

#include "common/os.h"

static inline void rtk_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* The holder's thread pointer is the lock word (NULL: free), so fork's handlers know a lock the forking thread
 * holds itself: a signal may land at any instruction, and one compare-and-swap leaves no moment where the lock is
 * taken but its holder unknown. */
typedef struct { void *volatile owner; int fork_kept; } rtk_spin_t;
#define RTK_SPIN_INIT {0, 0}

static inline void *rtk_thread_self(void) { return __builtin_thread_pointer(); }

static inline int rtk_spin_trylock(rtk_spin_t *l)
{
    void *expect = (void *)0;
    return __atomic_compare_exchange_n(&l->owner, &expect, rtk_thread_self(), 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static inline void rtk_spin_lock(rtk_spin_t *l)
{
    unsigned spins = 0;
    while (!rtk_spin_trylock(l)) {
        while (__atomic_load_n(&l->owner, __ATOMIC_RELAXED)) {
            if (++spins < 256)
                rtk_cpu_relax();
            else
                rtk_os_yield();  /* the holder may be descheduled: 2 cores, many threads */
        }
    }
}

static inline void rtk_spin_unlock(rtk_spin_t *l) { __atomic_store_n(&l->owner, (void *)0, __ATOMIC_RELEASE); }

/* fork's handlers. A lock the forking thread holds itself (a signal handler called fork while the thread was
 * inside the lock's section) is neither taken nor released: waiting for it would wait forever, and the section
 * goes on (in parent and child alike) and releases it once the handler returns. Every other lock is taken before
 * fork, released in the parent, and reset in the child, where only the forking thread exists. */
static inline void rtk_spin_fork_prepare(rtk_spin_t *l)
{
    if (__atomic_load_n(&l->owner, __ATOMIC_RELAXED) == rtk_thread_self()) {
        l->fork_kept = 1;
        return;
    }
    rtk_spin_lock(l);
}

static inline void rtk_spin_fork_parent(rtk_spin_t *l)
{
    if (l->fork_kept)
        l->fork_kept = 0;
    else
        rtk_spin_unlock(l);
}

static inline void rtk_spin_fork_child(rtk_spin_t *l)
{
    if (l->fork_kept) {
        l->fork_kept = 0;
        return;
    }
    l->owner = (void *)0;
}

#endif
