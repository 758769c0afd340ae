/* pmem_internal.h -- layouts and shared helpers of the PMEM segment allocator (not installed). */
#ifndef RTK_PMEM_INTERNAL_H
#define RTK_PMEM_INTERNAL_H

#include <pthread.h>
#include "common/os.h"
#include <stdatomic.h>
#include <stdint.h>
#include "rtkit/pmem.h"

#define RTK_EXPORT __attribute__((visibility("default")))
#define RTK_HDR RTKIT_PMEM_RECORD_HEADER
#define RTK_META_HDR 4096u /* pool header area; the segment table follows, then the segment summaries */
#define RTK_MAGIC "RTKPMEM1"
#define RTK_MAX_CLASSES 65535u

/* persistent pool header at offset 0; the immutable part has its own checksum so that the mutable
 * open/clean words can change without rewriting it */
struct rtk_hdr {
    char magic[8];
    uint32_t version, hdr_size;
    uint64_t pool_size, seg_size;
    uint32_t block_size, max_record;
    uint64_t nsegs, data_off, uuid, created_ns;
    uint64_t csum;
    uint64_t open_count, clean, mcsum;
};

/* segment table entry (one atomic 8-byte word, so it can never tear):
 * kind 0..7 | cls 8..23 | gen 24..47 | csum 48..63; the all-zero word is a pristine free segment */
enum { RTK_SEG_FREE = 0, RTK_SEG_CLASS = 1, RTK_SEG_EXTENT = 2, RTK_SEG_TAIL = 3 /* volatile only */ };
#define SEG_KIND(e) ((unsigned)((e) & 0xff))
#define SEG_CLS(e) ((unsigned)(((e) >> 8) & 0xffff))
#define SEG_GEN(e) ((uint32_t)(((e) >> 24) & 0xffffff))

/* record header: word = cls 0..15 | state 16..23 | requested size 24..63; check = hash(word, offset, gen, uuid).
 * cls 0 marks an extent.
 * Safety rule (docs/safety.md), format 2: the check is the commit marker. An alloc writes the check first and
 * the word (state ALLOC) last; a free writes the word (state FREE) first; a fresh class segment's headers are
 * zeroed before its table entry says "class"; an extent's header is complete before its table entry says
 * "extent". So a crash can leave only a FREE or zero word beside a stale check (a torn write: free), and an
 * ALLOC word whose check does not match, or a word in no known state, is corruption: check reports it and
 * open refuses the pool instead of freeing the record. */
enum { RTK_REC_ALLOC = 0xA1, RTK_REC_FREE = 0xF3 };
struct rtk_rec {
    _Atomic uint64_t word;
    _Atomic uint64_t check;
};
#define REC_CLS(w) ((unsigned)((w) & 0xffff))
#define REC_STATE(w) ((unsigned)(((w) >> 16) & 0xff))
#define REC_SIZE(w) ((uint64_t)((w) >> 24))
#define REC_WORD(cls, state, size) ((uint64_t)(cls) | ((uint64_t)(state) << 16) | ((uint64_t)(size) << 24))
#define RTK_MAX_REQUEST ((1ull << 40) - 1)

static inline uint64_t rtk_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static inline uint64_t rtk_rec_check(uint64_t word, uint64_t off, uint32_t gen, uint64_t uuid) {
    return rtk_mix64(word ^ rtk_mix64(off * 0x9e3779b97f4a7c15ull ^ ((uint64_t)gen << 40) ^ uuid)) | 1;
}

static inline uint64_t rtk_seg_entry(unsigned kind, unsigned cls, uint32_t gen, uint64_t seg, uint64_t uuid) {
    uint64_t low = (uint64_t)kind | ((uint64_t)cls << 8) | ((uint64_t)(gen & 0xffffff) << 24);
    if (low == 0) return 0;
    return low | ((rtk_mix64(low ^ seg * 0x9e3779b97f4a7c15ull ^ uuid) >> 48) << 48);
}

static inline int rtk_seg_entry_ok(uint64_t e, uint64_t seg, uint64_t uuid) {
    return e == 0 || rtk_seg_entry(SEG_KIND(e), SEG_CLS(e), SEG_GEN(e), seg, uuid) == e;
}

/* Segment summary (format 3), one per segment after the table, written at a clean close: how many records live in
 * the segment and a hash of their offsets and header words, of the table entry and of the segment's index. A
 * record is live when its own header says so, so without a second witness a zeroed header, or a segment whose
 * bytes were swapped with a free one, looks free and its record would be dropped. While the pool's clean flag is
 * set the summaries are current: open and check then count the live records again and call any difference
 * corruption. The flag is cleared at open, before any change, so a crash never leaves stale summaries trusted. */
struct rtk_sum {
    uint64_t live, hash;
};
static inline uint64_t rtk_sum_rec(uint64_t off, uint64_t word) { return rtk_mix64(off * 0x9e3779b97f4a7c15ull ^ word); }
static inline uint64_t rtk_sum_hash(uint64_t entry, uint64_t seg, uint64_t uuid, uint64_t live, uint64_t acc) {
    return rtk_mix64(acc ^ rtk_mix64(entry ^ seg * 0xc2b2ae3d27d4eb4full ^ uuid) ^ live * 0x165667b19e3779f9ull);
}

static inline uint64_t rtk_hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return rtk_mix64(h);
}

static inline uint64_t rtk_hdr_csum(const struct rtk_hdr *h) {
    return rtk_hash_bytes(h, __builtin_offsetof(struct rtk_hdr, csum));
}
static inline uint64_t rtk_hdr_mcsum(const struct rtk_hdr *h) {
    return rtk_mix64(h->open_count * 31 + h->clean + h->uuid);
}

static inline void rtk_spin_lock(atomic_int *l) {
    unsigned n = 0;
    while (atomic_exchange_explicit(l, 1, memory_order_acquire)) {
        while (atomic_load_explicit(l, memory_order_relaxed)) {
            if (++n > 200) {
                rtk_os_yield();
                n = 0;
            } else {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
        }
    }
}
static inline void rtk_spin_unlock(atomic_int *l) { atomic_store_explicit(l, 0, memory_order_release); }

/* growable stack of 3-word entries in mmap'ed memory (no malloc: the preload library links this in) */
struct rtk_vstack {
    uint64_t (*e)[3];
    uint64_t n, cap;
};
int rtk_vstack_push(struct rtk_vstack *s, uint64_t a, uint64_t b, uint64_t c);
int rtk_vstack_pop(struct rtk_vstack *s, uint64_t out[3]);
void rtk_vstack_free(struct rtk_vstack *s);

/* geometry shared by the live pool and the offline checker */
struct rtk_geom {
    uint64_t size, seg_size, nsegs, data_off, uuid;
    uint64_t sum_off; /* the segment summaries (struct rtk_sum each) */
    uint32_t block, shift, max_record, ncls, cmin;
    uint32_t seg_shift; /* log2(seg_size) when a power of two, else 0 */
    uint32_t strict;    /* format >= 2: an allocated record whose check fails is corruption, never a torn write */
};
static inline uint64_t rtk_seg_index(const struct rtk_geom *g, uint64_t off) {
    return g->seg_shift ? (off - g->data_off) >> g->seg_shift : (off - g->data_off) / g->seg_size;
}
int rtk_geom_compute(struct rtk_geom *g, uint64_t size, uint64_t seg_size, uint32_t block, uint32_t max_record,
                     char *why, size_t whylen);
static inline uint32_t rtk_rs(const struct rtk_geom *g, unsigned cls) { return cls << g->shift; }
static inline uint64_t rtk_nslots(const struct rtk_geom *g, unsigned cls) { return g->seg_size / rtk_rs(g, cls); }
static inline uint64_t rtk_seg_off(const struct rtk_geom *g, uint64_t s) { return g->data_off + s * g->seg_size; }

/* the live records of segment `s` as table entry `e` describes it, summarised (extent tails: pass a free entry) */
static inline void rtk_seg_summary(const struct rtk_geom *g, const char *base, uint64_t e, uint64_t s,
                                   struct rtk_sum *out) {
    uint64_t live = 0, acc = 0, soff = g->data_off + s * g->seg_size;
    unsigned k = SEG_KIND(e);
    if (k == RTK_SEG_EXTENT || k == RTK_SEG_CLASS) {
        uint32_t rs = k == RTK_SEG_EXTENT ? (uint32_t)g->seg_size : (SEG_CLS(e) << g->shift);
        uint64_t ns = k == RTK_SEG_EXTENT ? 1 : g->seg_size / rs;
        for (uint64_t i = 0; i < ns; i++) {
            const struct rtk_rec *r = (const struct rtk_rec *)(base + soff + i * rs);
            uint64_t w = atomic_load_explicit(&r->word, memory_order_relaxed);
            uint64_t off = soff + i * rs + RTK_HDR;
            if (REC_STATE(w) == RTK_REC_ALLOC &&
                atomic_load_explicit(&r->check, memory_order_relaxed) == rtk_rec_check(w, off, SEG_GEN(e), g->uuid)) {
                live++;
                acc += rtk_sum_rec(off, w);
            }
        }
    }
    out->live = live;
    out->hash = rtk_sum_hash(e, s, g->uuid, live, acc);
}

int rtk_fail(int code, int err, const char *path, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#endif
