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
/* 1 when p is a kept (so freed) block: realloc or a size query of it is the program's bug. */
RTK_HIDDEN int rtk_stash_holds(const void *p);
/* A kept block that fits n at align, or NULL. */
RTK_HIDDEN void *rtk_stash_pop(size_t n, size_t align);
RTK_HIDDEN void rtk_stash_fork_prepare(void);
RTK_HIDDEN void rtk_stash_fork_parent(void);
RTK_HIDDEN void rtk_stash_fork_child(void);

#endif
