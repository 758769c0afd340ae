/* owner.h -- whose block a pointer is (tier pool, planned arena class, large heap, fallback stash, glibc) and how
 * big: the one lookup behind free, realloc, malloc_usable_size and the public "is it rtkit's" checks. */
#ifndef RTK_PRMALLOC_OWNER_H
#define RTK_PRMALLOC_OWNER_H

#include "prmalloc/arena_slots.h"
#include "prmalloc/fallback_stash.h"
#include "prmalloc/large.h"
#include "prmalloc/tier.h"

/* RTK_OWNER_STASH: a glibc block the fallback stash keeps; the program freed it, so it is always RTK_BLOCK_FREE */
enum { RTK_OWNER_GLIBC = 0, RTK_OWNER_TIER, RTK_OWNER_LARGE, RTK_OWNER_ARENA, RTK_OWNER_STASH };

typedef struct rtk_owner {
    uint8_t kind;               /* RTK_OWNER_* */
    uint8_t state;              /* RTK_BLOCK_LIVE, RTK_BLOCK_FREE (a second free), RTK_BLOCK_NONE (no block starts at p) */
    int cls;                    /* RTK_OWNER_ARENA: the class holding the block (in the arena below) */
    size_t size;                /* the block's bytes (an arena block's class size even while it is free); 0 when none,
                                 * and for glibc's blocks: their chunk header says, read only for a pointer glibc gave */
    rtk_arena_t *arena;         /* RTK_OWNER_ARENA: the arena holding the block */
    uint64_t tier_handle;       /* RTK_OWNER_TIER: the pool record, as the lookup read it from the payload's header:
                                 * the free reads the header no more (a fourth word: more would cost the free paths) */
} rtk_owner_t;

/* An arena block's owner word in the large heap's page map: the heap's mark, bit 29 handed out (clear: on its
 * class's free stack), bits 8-15 the arena's slot, bits 0-7 the class. */
#define RTK_OWNER_INUSE 0x20000000u
#define RTK_OWNER_WORD(slot, k) (RTK_LARGE_OWNED | (uint32_t)(slot) << 8 | (uint32_t)(k))
#define RTK_OWNER_SLOT(w) ((int)(((w) >> 8) & 0xffu))
#define RTK_OWNER_CLASS(w) ((int)((w) & 0xffu))

/* Two range tests decide the owner; inside the large heap its page map says, in one read, whether p starts a
 * block, its bytes, and which arena class (if any) holds it; a tier payload's header gives its bytes; outside both,
 * the stash's slots say whether it keeps p (one load while it keeps nothing). Any pointer may be asked (nothing
 * outside rtkit's ranges is read). Lock-free: the freeing paths look again under their locks. */
static inline rtk_owner_t rtk_owner_of(const void *p)
{
    rtk_owner_t o = {RTK_OWNER_GLIBC, RTK_BLOCK_LIVE, -1, 0, NULL, 0};
    if ((uintptr_t)p - rtk_fastpath.tier_lo < rtk_fastpath.tier_span) {
        uint64_t h;  /* locals: o's own address is never taken here */
        int freed;
        o.kind = RTK_OWNER_TIER;
        o.size = rtk_tier_usable(p, &h, &freed);
        o.tier_handle = h;
        o.state = o.size ? RTK_BLOCK_LIVE : freed ? RTK_BLOCK_FREE : RTK_BLOCK_NONE;
        return o;
    }
    if ((uintptr_t)p - rtk_large_lo >= rtk_large_span) {
        if (__builtin_expect(rtk_stash_holds(p), 0)) {
            o.kind = RTK_OWNER_STASH;
            o.state = RTK_BLOCK_FREE;
        }
        return o;
    }
    size_t bytes;
    uint32_t w;
    o.kind = RTK_OWNER_LARGE;
    o.state = rtk_large_block(p, &bytes, &w);
    o.size = bytes;
    int slot = RTK_OWNER_SLOT(w), k = RTK_OWNER_CLASS(w);
    rtk_arena_t *a = w && slot < __atomic_load_n(&rtk_arena_slots_used, __ATOMIC_ACQUIRE) ? rtk_arena_slots[slot] : NULL;
    if (!a || !a->span || k >= a->n)
        return o;  /* no arena in service names it: the large heap's own */
    o.kind = RTK_OWNER_ARENA;
    o.arena = a;
    o.cls = k;
    o.size = a->cls[k].size;
    o.state = (w & RTK_OWNER_INUSE) ? RTK_BLOCK_LIVE : RTK_BLOCK_FREE;
    return o;
}

#endif
