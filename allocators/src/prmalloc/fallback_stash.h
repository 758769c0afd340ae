/* fallback_stash.h -- the fallback stash: freed large glibc blocks kept for the next fallback once a plan is in service. */
#ifndef RTK_PRMALLOC_FALLBACK_STASH_H
#define RTK_PRMALLOC_FALLBACK_STASH_H

#include "prmalloc/state.h"

/* Keep blocks up to twice the plan's largest class; frees at or above min_size start asking. */
RTK_HIDDEN void rtk_stash_enable(const rtk_plan_t *p, size_t min_size);
/* Empty the stash into glibc and keep nothing more (profiling again). */
RTK_HIDDEN void rtk_stash_disable(void);
/* Keep a freed glibc chunk of cs bytes. 1 when kept: the caller must not free it. -1 when p is kept already: a
 * double free, which the caller reports and aborts on, as glibc does. */
RTK_HIDDEN int rtk_stash_push(void *p, size_t cs);
/* The kept blocks, read lock-free by rtk_stash_holds: slots [0, rtk_stash_top) may hold one (NULL: empty), and
 * rtk_stash_bits has bit RTK_STASH_BIT(q) set for each kept q, so most pointers are told "not kept" by one load
 * and a bit test (malloc's 16-byte alignment makes the bits above it evenly spread). */
#define RTK_STASH 16
#define RTK_STASH_BIT(p) ((uint64_t)1 << (((uintptr_t)(p) >> 4) & 63))
RTK_HIDDEN extern void *rtk_stash_slot[RTK_STASH];
RTK_HIDDEN extern int rtk_stash_top;
RTK_HIDDEN extern uint64_t rtk_stash_bits;
/* 1 when p is a kept (so freed) block: the owner lookup's answer RTK_OWNER_STASH (free, realloc or a size query of
 * it is the program's bug). Lock-free, any pointer may be asked. */
static inline int rtk_stash_holds(const void *p)
{
    if (__builtin_expect(!(__atomic_load_n(&rtk_stash_bits, __ATOMIC_ACQUIRE) & RTK_STASH_BIT(p)), 1) || !p)
        return 0;
    int top = __atomic_load_n(&rtk_stash_top, __ATOMIC_ACQUIRE);
    for (int i = 0; i < top; i++)
        if (__atomic_load_n(&rtk_stash_slot[i], __ATOMIC_ACQUIRE) == p)
            return 1;
    return 0;
}
/* A kept block that fits n at align (the most recently kept of those), or NULL. */
RTK_HIDDEN void *rtk_stash_pop(size_t n, size_t align);
RTK_HIDDEN void rtk_stash_fork_prepare(void);
RTK_HIDDEN void rtk_stash_fork_parent(void);
RTK_HIDDEN void rtk_stash_fork_child(void);

#endif
