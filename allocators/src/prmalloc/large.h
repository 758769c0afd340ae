/* large.h -- the retained large-object heap: page-granular extents with coalescing in one reserved range, pages
 * kept across steps and given back by a step-aware decay; O(1) per-block state for double-free detection. */
#ifndef RTK_PRMALLOC_LARGE_H
#define RTK_PRMALLOC_LARGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/log.h"

typedef struct rtk_large_info {
    size_t reserved;   /* address space the range may grow to */
    size_t mapped;     /* address space it has taken so far */
    size_t used;       /* bytes ever handed out from the range (its high-water mark) */
    size_t in_use;     /* bytes of live blocks */
    size_t idle;       /* bytes of free blocks still resident */
    size_t released;   /* bytes of free blocks given back to the kernel */
    uint64_t blocks, decayed_bytes, trims;
    size_t prefaulted; /* bytes faulted in ahead of need at plan install (rtk_large_reserve) */
} rtk_large_info_t;

/* [rtk_large_lo, rtk_large_lo + rtk_large_span): the range mapped so far (span 0 until the heap exists); it grows in
 * place, a piece at a time, up to rtk_large_reach bytes: address space is taken as the heap needs it, so a program
 * that lowers RLIMIT_AS after start still has its room (threads, its own mappings) */
RTK_HIDDEN extern uintptr_t rtk_large_lo, rtk_large_span, rtk_large_reach;

/* the address the range is asked for (high, above glibc's heaps and the libraries); the kernel may place it
 * elsewhere, only 2 MiB-aligned. A variable so a test can ask for an address that is aligned to no more. */
RTK_HIDDEN extern uintptr_t rtk_large_hint;

/* the most address space the range may grow to (MAP_NORESERVE: nothing resident until used), the piece it maps at a
 * time, and the first one it maps at start (small: a program may lower RLIMIT_AS to a few hundred MiB after start) */
#define RTK_LARGE_LIMIT ((size_t)64 << 30)
#define RTK_LARGE_PIECE ((size_t)256 << 20)
#define RTK_LARGE_FIRST ((size_t)32 << 20)
/* Place the range (at most `limit` bytes, capped by RLIMIT_AS / 4) and its page map, and map the first piece of
 * both (large_map.c). 0 ok, -1 failed. */
RTK_HIDDEN int rtk_large_init(size_t limit, int thp);
/* A block of at least n bytes aligned to align (a power of two; page alignment at least); NULL when the range
 * is full. *usable receives the block's bytes. */
RTK_HIDDEN void *rtk_large_alloc(size_t n, size_t align, size_t *usable);
/* The same from wholly resident free pages only (never fresh or given-back ones); NULL when none fits. */
RTK_HIDDEN void *rtk_large_alloc_resident(size_t n, size_t align, size_t *usable);
/* Free a block. 0 ok; -1 p is not the start of a block (interior or foreign pointer); -2 the block is free
 * already (double free). *bytes receives the freed block's size. The caller aborts on < 0. */
RTK_HIDDEN int rtk_large_free(void *p, size_t *bytes);
/* The same, its pages given back to the kernel first (a dropped class's or a retired arena's block). */
RTK_HIDDEN int rtk_large_free_release(void *p, size_t *bytes);
/* Owner word of a live block: planned arena classes hold large-heap blocks and mark them (RTK_LARGE_OWNED, then
 * their own bits: prmalloc/owner.h), so free finds a block's class in O(1) without a header; a new block carries none. */
#define RTK_LARGE_OWNED 0x80000000u
#define RTK_LARGE_OWNED_MASK 0xc0000000u
RTK_HIDDEN void rtk_large_set_owner(void *p, uint32_t w);
/* A class's free, under its lock: the owner word of the live block at p becomes w when it is `expect`. Returns the
 * word p's block carried (0 when p starts no live block or the block carries no mark); unchanged unless `expect`. */
RTK_HIDDEN uint32_t rtk_large_swap_owner(void *p, uint32_t expect, uint32_t w);
/* An arena class takes the live block at p as one of its own blocks, free (its owner word becomes w): 0 done;
 * -1 p starts no live block, -2 a class holds it already (a second free); under the heap's lock, so a racing
 * free of p finds it owned and fails as a double free. */
RTK_HIDDEN int rtk_large_adopt(void *p, uint32_t w);
/* counts[i] = live blocks no class holds whose page count is pages[i] (pages ascending, n entries). */
RTK_HIDDEN void rtk_large_count_live(const uint32_t *pages, int n, uint32_t *counts);
/* Tier mode's watch on what it left in DRAM: the live block at p (just allocated, the caller's) was made at `step`;
 * count_watched: the live blocks no class holds that were watched and made at step `made_by` or before, and their
 * bytes (one walk of the extents, under the heap's lock: at stats writes only). */
RTK_HIDDEN void rtk_large_watch(void *p, uint32_t step);
RTK_HIDDEN void rtk_large_count_watched(uint32_t made_by, uint64_t *blocks, uint64_t *bytes);
/* What the page map says of p (lock-free): RTK_BLOCK_LIVE when p starts a live block (*bytes its size, *owner its
 * owner word when it carries the mark, else 0), RTK_BLOCK_FREE when p starts a free extent (a second free),
 * RTK_BLOCK_NONE when no block starts at p (an interior or foreign pointer); *bytes and *owner are 0 then. */
enum { RTK_BLOCK_NONE = 0, RTK_BLOCK_LIVE = 1, RTK_BLOCK_FREE = 2 };
RTK_HIDDEN int rtk_large_block(const void *p, size_t *bytes, uint32_t *owner);
/* Grow or shrink the live block at p in place to at least n bytes (taking or returning following free pages).
 * 1 done (*usable = new size), 0 not possible here. */
RTK_HIDDEN int rtk_large_resize(void *p, size_t n, size_t *usable);
/* Step mark: free blocks unused for `decay_steps` steps give their pages back (0: never), oldest first, as far
 * as the idle pages exceed the heap's high-water mark since the last epoch (plus 1/8). */
RTK_HIDDEN void rtk_large_step(uint32_t step, uint32_t decay_steps);
/* A plan was installed: the high-water mark the decay keeps restarts from the bytes in use now. */
RTK_HIDDEN void rtk_large_epoch(void);
/* Keep at least `bytes` of wholly resident idle pages: the shortfall is taken from fresh or given-back pages,
 * faulted in now (one populate call) and freed back resident. Returns the bytes faulted in. */
RTK_HIDDEN size_t rtk_large_reserve(size_t bytes);
/* malloc_trim: give back every idle page now. Returns the bytes released. */
RTK_HIDDEN size_t rtk_large_trim(void);
RTK_HIDDEN void rtk_large_info(rtk_large_info_t *out);
/* RTKIT_MALLOC_DEBUG's poison: the first bytes of a freed block of rtkit's memory. A block handed out again
 * must still hold it (or zero: pages given back read as zero), else the program wrote to it after freeing it. */
#define RTK_POISON_BYTES 64
#define RTK_POISON 0xdb
/* Debug mode: the heap keeps that rule true of every block it hands out, so only the program's writes break it:
 * the start of every resident free extent holds the poison (a split or a shrink starts one inside old data), and
 * a block that starts inside a free extent, not at its start, gets it too. */
RTK_HIDDEN void rtk_large_set_debug(int on);
/* fork's handlers (common/lock.h: a lock the forking thread holds itself is left alone) */
RTK_HIDDEN void rtk_large_lock(void);
RTK_HIDDEN void rtk_large_unlock(void);
RTK_HIDDEN void rtk_large_reset_lock(void);

#endif
