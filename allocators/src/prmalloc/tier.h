/* tier.h -- PMEM tier mode of the preload allocator: long-lived large allocations placed in a pool file. */
#ifndef RTK_PRMALLOC_TIER_H
#define RTK_PRMALLOC_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "prmalloc/state.h"

/* Smallest request tier mode may place in the pool; SIZE_MAX while tier mode is off (the only test on the
 * allocation path when RTKIT_TIER_POOL_PATH is empty). */
RTK_HIDDEN extern size_t rtk_tier_min;
RTK_HIDDEN extern int rtk_tier_pre;   /* 1 until the first step mark */

/* Read the tier_pool_path / tier_pool_size / tier_min_size settings (no allocation, no output); called from do_init. */
RTK_HIDDEN void rtk_tier_read_settings(void);
/* Place a request in the pool. longlived: 0 = the caller is before the first step mark (any size >= min),
 * 1 = after it (only sizes the profiler saw outliving steps). NULL: not placed, caller uses DRAM. */
RTK_HIDDEN void *rtk_tier_alloc(size_t n, size_t align, int zero, int longlived);
/* The bytes of the pool payload p (the owner lookup's size of a tier block), its record handle in *handle; 0 when p
 * is not one, with *freed 1 when p is a payload a free already gave back. */
RTK_HIDDEN size_t rtk_tier_usable(const void *p, uint64_t *handle, int *freed);
/* Free live payload p of n bytes and record handle, as rtk_tier_usable found them (the header is not read again):
 * 0 when this call freed it, -2 when another free of p claimed it first (a double free: nothing is touched, the
 * caller aborts). Never handed to glibc. */
RTK_HIDDEN int rtk_tier_free(void *p, size_t n, uint64_t handle);
/* realloc of a live pool payload of `old` bytes (its owner's size) to n bytes: 1 when it can stay (a mild shrink),
 * 0 when it must move. */
RTK_HIDDEN int rtk_tier_keeps(size_t old, size_t n);
/* The profiler carries allocation p (of `size`) live across a step boundary (called under the profiler lock);
 * one carried across two boundaries in a row marks its size long-lived. carry_done closes the boundary. */
RTK_HIDDEN void rtk_tier_note_carried(uintptr_t p, size_t size);
RTK_HIDDEN void rtk_tier_carry_done(void);
RTK_HIDDEN void rtk_tier_plan_ready(void);
RTK_HIDDEN void rtk_tier_step_mark(void);
/* Write $RTKIT_RUN_DIR/pmem-<pid>.json when tier mode is configured. */
RTK_HIDDEN void rtk_tier_write_file(const char *run_dir, long pid);
/* At a step mark whose stats write is not due: the residency sample (and, without heat, the resident budget's check)
 * keeps its own pace (once a second, at doubled step counts), not the files' (every 2-5 s). */
RTK_HIDDEN void rtk_tier_step_sample(void);
/* The live records of at least min_bytes: up to max (payload address, requested bytes) pairs into out; their count */
RTK_HIDDEN size_t rtk_tier_records(uint64_t (*out)[2], size_t max, uint64_t min_bytes);
RTK_HIDDEN void rtk_tier_fork_prepare(void);  /* last of the prepare handlers: it takes the live-record lock */
RTK_HIDDEN void rtk_tier_fork_parent(void);
RTK_HIDDEN void rtk_tier_fork_child(void);
RTK_HIDDEN void rtk_tier_exit(void);
/* The heat budget's worker (tier_worker.c) across fork: paused (the first prepare handler), resumed (the parent's
 * last), forgotten (the child's: no worker runs there); stopped and joined at exit, before the stats are written. */
RTK_HIDDEN void rtk_tier_worker_pause(void);
RTK_HIDDEN void rtk_tier_worker_resume(void);
RTK_HIDDEN void rtk_tier_worker_forget(void);
RTK_HIDDEN void rtk_tier_worker_stop(void);
/* The pager's evictor (tier_pager.c) across fork and at exit, as the worker's. */
RTK_HIDDEN void rtk_tier_pager_fork_prepare(void);
RTK_HIDDEN void rtk_tier_pager_fork_parent(void);
RTK_HIDDEN void rtk_tier_pager_fork_child(void);
RTK_HIDDEN void rtk_tier_pager_stop(void);

#endif
