/* prmalloc.h -- the public C interface of librtkit_malloc.so (PRMalloc) beyond the interposed malloc API. */
#ifndef RTKIT_PRMALLOC_H
#define RTKIT_PRMALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Mark the END of one training step. Called by rtkit's Python hooks (ctypes.CDLL(None).rtkit_step_mark)
 * once per step; drives warm-up -> profiling -> planned arenas, the per-step census and the stats file.
 * Cheap when nothing is due (sums per-thread counters); thread-safe; a no-op when RTKIT_MALLOC=0. */
void rtkit_step_mark(void);

/* State of the allocator: 0 disabled, 1 passthrough (census only, waiting for steps), 2 profiling, 3 planned. */
int rtkit_malloc_state(void);

/* 1 when p lies inside one of the planned arenas (served without glibc), else 0. */
int rtkit_malloc_in_arena(const void *p);

/* 1 when p is a live block of tier mode's PMEM pool (RTKIT_MALLOC_TIER; served from the pool file, not DRAM),
 * else 0 (also when tier mode is off). */
int rtkit_malloc_in_pmem(const void *p);

/* The tier pool's live records of at least min_bytes: up to max pairs of (payload address, requested bytes)
 * written to out; returns how many (0 when tier mode is off). The scheduler's lookahead tells a table or an
 * optimizer slot by its rows' values among the records of its byte size. */
size_t rtkit_malloc_pool_records(uint64_t (*out)[2], size_t max, uint64_t min_bytes);

/* Write $RTKIT_RUN_DIR/allocator-<pid>.json now (no throttling). 0 on success, -errno, or -1 when no run
 * directory is set or the allocator is disabled. */
int rtkit_malloc_write_stats(void);

/* Tier mode's heat budget (tier_resident_max with tier_heat_every): the pages (page numbers, address / page_bytes,
 * page_bytes a multiple of 4096) the next step will use, read ahead by the caller (rtkit's scheduler lookahead).
 * Being unwritten they read as cold; the budget's next step mark drops them last, after every other pool page, and
 * forgets them after it. Thread-safe, lock-free, allocates nothing. Returns the 4 KiB pool pages recorded, or -1
 * when nothing is recorded (tier mode or its heat budget off, before the first step mark, a forked child). */
long rtkit_tier_want(const uint64_t *pages, size_t n, size_t page_bytes);

/* out[0..n) of: pages recorded by rtkit_tier_want, pages the budget kept (resident wanted pages of chunks whose
 * other pages it dropped), wanted pages it dropped all the same (its goal needed them). Returns the entries filled
 * (at most 3), or -1 as rtkit_tier_want. */
int rtkit_tier_want_counts(uint64_t *out, int n);

/* Which of `pages` (page numbers, address / page_bytes, page_bytes a multiple of 4096; sorted ascending is cheapest)
 * are in DRAM: out[k] = 1 or 0, one mincore per cluster of nearby pages (the lookahead's check of a step's rows,
 * any memory of the process). Returns how many are, or -1 on bad arguments; an unmapped page counts as out. */
long rtkit_tier_resident(const uint64_t *pages, size_t n, size_t page_bytes, uint8_t *out);

/* The heat budget's passes run on a worker thread of the library, beside the steps; a step mark only asks for one.
 * Wait until the passes asked for so far are done (for tests and tools that read a pass's effect right after a
 * mark): returns the passes run so far (a heat sample each), or -1 when no worker runs (heat off or unavailable,
 * before the first step mark, a forked child, after exit began). */
long rtkit_tier_heat_wait(void);

/* For tests: on=1 holds the worker's next pass where it has sampled heat and copied the live records and dropped
 * nothing yet, until called with on=0 (or the process exits). Returns 1 once a pass is held there, 0 while not yet,
 * -1 when no worker runs. */
int rtkit_tier_heat_hold(int on);

/* tier_pager's evictor runs on a thread of the library, beside the steps; a step mark only asks for a pass. Ask for
 * one more and wait until it ran (for tests and tools that read an eviction's effect right after a mark): returns
 * the passes run so far, or -1 where the pager does not run (off, refused, a forked child, after exit began). */
long rtkit_tier_pager_wait(void);
/* Read ahead, into DRAM, the pages of the pool the pager evicted (or never brought in) among `pages` (page numbers:
 * address / page_bytes, page_bytes a multiple of 4 KiB), before a step touches them: the runs are read from the pool
 * file together and put in place, so the step finds them instead of faulting them in one after another. Pages in
 * DRAM, holes, and chunks the evictor is moving are left alone. Blocks while it reads (callers: a lookahead thread,
 * not a step). Returns the 4 KiB pages filled, or -1 where the pager does not run (off, refused, a forked child,
 * before the first step mark, after exit began). */
long rtkit_tier_pager_fetch(const uint64_t *pages, size_t n, size_t page_bytes);
/* Tell the pager that the next step uses `pages` (page numbers as for rtkit_tier_pager_fetch), every page of every
 * region of the pool it will read or write: one call per step. A region told for every step of a heat window is then
 * write-protected at every eighth heat scan, twice as far apart after each cycle in which writes to pages never told
 * were few (at most 1 in 8; up to every 32nd), at every scan again after one in which they were many (a slot its
 * optimizer writes whole); its told pages count as written. The steps' writes fault that much less often. Returns
 * the 4 KiB pages recorded, or -1 where the pager does not run. */
long rtkit_tier_pager_heat(const uint64_t *pages, size_t n, size_t page_bytes);
/* How alike the write history of `bytes` at `table` is to that at each of cands[0..n) (all in the pool, each at the
 * same offset in its page as `table`), page for page: scores[k] = the share of the pages resident in both, and not
 * written since the last heat scan in both, that the same number of scans ago the steps last wrote (-1: no such page,
 * or a candidate outside the pool or at another offset). An optimizer slot of a table is written at the same rows
 * in the same steps: its score is near 1, another table's slot's far less. Returns the most pages compared, or -1
 * where the pager does not run or `table` is not in the pool. */
long rtkit_tier_pager_likeness(const void *table, const void *const *cands, size_t n, size_t bytes, double *scores);
/* The heat scans the pager has run so far (they start a few scans before it nears its limit, so a caller pairing
 * records by their write histories waits for two), or -1 where the pager does not run. */
long rtkit_tier_pager_scans(void);

/* Schema version of allocator-<pid>.json and of the plan file format. */
#define RTKIT_MALLOC_STATS_SCHEMA 2
#define RTKIT_MALLOC_PLAN_VERSION 1

#ifdef __cplusplus
}
#endif
#endif
