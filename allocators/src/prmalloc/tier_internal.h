/* tier_internal.h -- what the tier-mode files share: the tier's state, its table of live pool records, the view. */
#ifndef RTK_PRMALLOC_TIER_INTERNAL_H
#define RTK_PRMALLOC_TIER_INTERNAL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "common/lock.h"
#include "common/options.h"
#include "common/os.h"
#include "prmalloc/tier.h"
#include "rtkit/pmem.h"

#define TIER_HDR 32                       /* size, handle, live index, tag in front of every payload */
#define TIER_PAGE 4096
#define TIER_CHUNK_SHIFT 16               /* page heat and promotion work on 64 KiB chunks of the pool */
#define TIER_CHUNK ((uint64_t)1 << TIER_CHUNK_SHIFT)
#define RUNS_MAX 4096                     /* promotions a process makes at most: a private mapping each */
#define LIVE_CAP (1u << 20)               /* records in the live table at most */
#define HEAD_CAP 4096                     /* records with a DRAM head at most (fork remaps around each) */
#define TL_CAP 1024                       /* residency samples kept (a ring) */
#define TOP_N 16                          /* largest records kept for the report */
/* Before the first step, freed records keep their pages for the next record (graph construction churns the
 * pool) up to this many bytes; past it a free punches its pages at once, so a job whose steps rtkit never sees
 * holds at most this much more than it would in DRAM. */
#define TIER_DEFER_MAX (32ull << 20)
/* Placement before the first step bets that what is allocated then is tables. Once the frees say otherwise
 * (this many bytes freed, and more than 3/4 of what was placed), later requests stay in DRAM until a step. */
#define TIER_CHURN_STOP (256ull << 20)
/* A request this large is placed before the first step even once the churn stopped placement: a user's table made
 * by an initializer reaches TensorFlow through temporaries of its own size (the initial value, the constant kernel
 * that holds it, the copy the first sparse update makes), and the copy that lives is allocated after the
 * temporaries were freed. Churn of this size is rare (a request each, at most a few), the tables are what tier
 * mode is for. */
#define TIER_TABLE_BYTES (64ull << 20)

enum { T_OFF = 0, T_IDLE, T_CREATING, T_ON, T_FAILED, T_BUSY, T_CHILD };

/* A live pool record. resident: its file pages in DRAM; head: its DRAM head's bytes; head_resident: their pages
 * in DRAM; born: its place in the order records were made (a record made later at the same address is another
 * one); promoted: the bytes of its chunks the heat passes made private. Its index in the table is kept in its tier
 * header (hd[2]); a free swaps the last entry into its place. */
typedef struct {
    char *rec;
    uint64_t len;
    char *payload;
    uint64_t n;
    uint64_t resident, head, head_resident, born, promoted;
} live_t;

typedef struct {
    int state;
    char path[PATH_MAX];
    size_t size;                          /* the pool's: tier_pool_size until it is made, then its own */
    rtkit_pmem_pool *pool;
    char *base;
    long owner;
    int plan_ready;
    char medium[16];
    char reason[PATH_MAX + 512];
    /* counters (relaxed atomics: every placed request is >= min size, so these are rare) */
    uint64_t bytes, peak, allocs, frees, fallbacks, fallback_bytes, pre_allocs, pre_bytes, ll_allocs, ll_bytes;
    /* the largest request the pool had no room for, what it held then, and whether that was before the first step */
    uint64_t fallback_largest, fallback_largest_held, fallback_largest_pre;
    uint64_t bad_frees, child_frees, errors_other;
    uint64_t bytes_at_mark, steps;
    unsigned ll_sizes;                    /* long-lived sizes known */
    int fd;                               /* the pool file, kept open once its name is unlinked (fork remaps it) */
    uint64_t deferred_frees, deferred_bytes, gap_punches, gap_bytes, cold_hint_bytes;
    uint64_t pre_freed_bytes;             /* bytes of records placed before the first step and freed before it */
    int pre_stopped;                      /* placement before the first step stopped: the pool churned */
    int no_remove;                        /* the file system cannot punch holes: freed pages stay */
    uint64_t remove_errors;
    /* DRAM heads (tier_dram_head): what the first step mark made private, the budget it had, and what it cost; the
     * chunks the heat passes promoted (bytes, chunks, given back) and the runs refused at RUNS_MAX */
    uint64_t head_budget, head_bytes, head_records, head_restored, heads_at_mark;
    uint64_t head_promoted, head_promoted_chunks, head_promoted_restored, head_runs_refused;
    uint64_t head_kept_errors;            /* freed records whose head could not be given back: never reused */
    double head_s;
    /* the live records: for punching free space at the first step mark, the heads, the budget, the view */
    live_t *live;
    uint32_t nlive;
    uint64_t high;                        /* highest record end ever handed out (offset from base) */
    rtk_spin_t live_lock;
    int live_overflow;                    /* a record the table could not hold: the first mark punches nothing */
    uint64_t born;                        /* records made so far (under the live lock): the next one's live_t.born */
    int exiting;
    /* The heat pass (tier_heat.c) runs on the budget's worker thread (tier_worker.c) under the pass lock, taking the
     * live lock only for moments. At its pass points it gives the pass lock up while asked to: pause (a fork is on
     * its way: its prepare handler takes the lock), hold (a test holds the pass there), stop (exit). Futex words. */
    rtk_spin_t pass_lock;
    uint32_t pass_pause, pass_hold, pass_held, pass_stop;
} rtk_tier_t;

RTK_HIDDEN extern rtk_tier_t rtk_tier;

/* One residency sample: at a step count and time, the pool pages in DRAM, the pool's bytes, the major faults. */
typedef struct { uint64_t step; double t_s; uint64_t resident, tier_bytes, major_faults; } tl_t;

/* What the residency samples found (tier_budget.c), for the report (tier_stats.c). */
typedef struct {
    tl_t timeline[TL_CAP];
    unsigned ntimeline;                   /* samples taken; the ring keeps the last TL_CAP */
    uint64_t resident;                    /* pool bytes in DRAM at the last sample */
    /* the sample with the highest RSS before exit: the process's RSS, every pool page in DRAM (counted once,
     * freed records' pages and headers included) and the bytes live in the pool then */
    struct { uint64_t rss, pool_dram, live, step; double t_s; } at_rss_peak;
    uint64_t passes, dropped_bytes;       /* resident-budget passes and what they dropped */
    live_t top[TOP_N];                    /* the largest records at the last sample while training ran */
    int ntop;
    /* page heat (tier_heat_every): samples, chunks the budget dropped (demoted) and chunks written again after
     * a drop (promoted), what the drops freed and how much of it the scans saw written since its last drop,
     * pages seen written, chunks written at the last sample, the resident bytes after it, the sampler's time */
    uint64_t heat_samples, heat_demoted, heat_promoted, heat_demoted_bytes, heat_written_out_bytes;
    uint64_t heat_pages_written, heat_hot_chunks, heat_resident, heat_watch_errors;
    double heat_s;                        /* the passes' time (on the worker thread where it runs) */
    double heat_mark_s;                   /* the step marks' time in the heat budget (arming, signalling the worker) */
    uint64_t heat_merged, heat_skipped;   /* marks due a pass while one ran (served by the next), records freed since
                                           * a pass's sample (their pages left alone) */
    int heat_worker;                      /* 1: the passes run on the worker thread, -1: it could not start */
    char heat_note[256];
    /* pages the lookahead said its next step uses (rtkit_tier_want): calls, pages recorded, resident ones the
     * budget kept while dropping the rest of their chunks, and ones it dropped all the same to reach its goal */
    uint64_t want_calls, want_pages, want_kept, want_dropped;
} rtk_tier_view_t;

RTK_HIDDEN extern rtk_tier_view_t rtk_tier_view;

static inline double rtk_tier_now_s(void) { return (double)rtk_os_now_ns() * 1e-9; }
/* A DRAM head starts at the payload's first whole page: the tier header below it stays in the file. */
static inline char *rtk_tier_head_lo(const char *payload)
{
    return (char *)(((uintptr_t)payload + TIER_PAGE - 1) & ~(uintptr_t)(TIER_PAGE - 1));
}

/* Where a record's droppable pages begin: past its DRAM head (with swap, MADV_PAGEOUT would send the head's
 * anonymous pages there), else at its first page. */
static inline uintptr_t rtk_tier_file_lo(const live_t *r)
{
    return r->head ? (uintptr_t)rtk_tier_head_lo(r->payload) + r->head : (uintptr_t)r->payload & ~(uintptr_t)4095;
}

/* tier_heads.c: give a freed record's head back to the pool file (under the live lock); -1: it stays private. */
RTK_HIDDEN int rtk_tier_restore_head(live_t *r);
/* tier_heads.c: the heads' pages the steps wrote (their private copies) now and at most, or -errno where the kernel
 * cannot tell */
RTK_HIDDEN long long rtk_tier_heads_written(long long *peak);
/* tier_private.c: private ranges of the pool (heads, promoted chunks). private_map: make [lo, lo + len) private (its
 * length, or 0); promoted_arm: map the promoted-chunk map (0, or -1); promote_room: bytes the heat passes may still
 * promote (0: heads or heat off); chunk_promoted: 1 while chunk c is private (a relaxed read); promote: make chunks
 * [c, c + n) of the live record at index `at` made `born`-th private (0, or -1 when it is gone, past the room or the
 * run limit); promoted_runs: private runs now. Under the live lock: restore_promoted gives record r's promoted chunks
 * back to the file's shared pages, calling remapped on each run (0, or -1 where one stays private);
 * promoted_resident: their pages in DRAM; private_written: the bytes of r's head and promoted chunks the steps wrote
 * (by PAGEMAP_SCAN on `pagemap`; -errno where it cannot tell); promoted_ranges: the runs as [start, end) offsets, at
 * most cap of them (a forked child's remap keeps them). */
RTK_HIDDEN uint64_t rtk_tier_private_map(char *lo, uint64_t len);
RTK_HIDDEN uint64_t rtk_tier_private_held(void);  /* bytes of heads and promoted chunks that live */
RTK_HIDDEN int rtk_tier_promoted_arm(void);
RTK_HIDDEN uint64_t rtk_tier_promote_room(void);
RTK_HIDDEN int rtk_tier_chunk_promoted(uint64_t c);
RTK_HIDDEN int rtk_tier_promote(uint32_t at, uint64_t born, uint64_t c, uint64_t n);
RTK_HIDDEN uint64_t rtk_tier_promoted_runs(void);
RTK_HIDDEN int rtk_tier_restore_promoted(const live_t *r, void (*remapped)(char *lo, uint64_t len));
RTK_HIDDEN uint64_t rtk_tier_promoted_resident(const live_t *r);
RTK_HIDDEN long long rtk_tier_private_written(const live_t *r, int pagemap);
RTK_HIDDEN long rtk_tier_promoted_ranges(uint64_t (*out)[2], long cap);
/* tier_budget.c: sample residency (at most once a second unless forced) and enforce tier_resident_max where no
 * page heat is measured (round-robin). */
RTK_HIDDEN void rtk_tier_sample(int force);
/* tier_resident.c: keep the sample with the highest RSS (the pool's DRAM and live bytes then), for the report. */
RTK_HIDDEN void rtk_tier_sample_rss(uint64_t pool_dram);
/* tier_resident.c: the mincore vector (VEC_PAGES entries), mapped at its first use (NULL when it cannot be), and
 * the bytes of [lo, lo + len) in DRAM */
#define VEC_PAGES (1u << 16)              /* mincore vector: 256 MiB of pool per call */
RTK_HIDDEN extern unsigned char *rtk_tier_vec;
RTK_HIDDEN unsigned char *rtk_tier_mincore_vec(void);
RTK_HIDDEN uint64_t rtk_tier_resident_of(char *lo, uint64_t len);
RTK_HIDDEN uint64_t rtk_tier_resident_in(char *lo, uint64_t len, unsigned char *vec);  /* with the caller's vector */
RTK_HIDDEN extern double rtk_tier_t0;     /* the time of the first residency sample (0: none yet), set by tier_budget.c */
/* tier_heat.c: page heat and the budget on it. due: what a step mark owes it (0 nothing, 1 arming, at the first
 * mark after the heads, under the live lock: heat_arm, 2 a pass); pass: sample heat and, over the budget, write out
 * and drop the coldest pages, for the step `step` is about to run (under the pass lock); on: 1 while heat is
 * measured; watch a range remapped inside the pool; the forked child's part. */
RTK_HIDDEN int rtk_tier_heat_due(void);
RTK_HIDDEN void rtk_tier_heat_arm(void);
RTK_HIDDEN void rtk_tier_heat_pass(uint64_t step);
RTK_HIDDEN int rtk_tier_heat_on(void);
RTK_HIDDEN void rtk_tier_heat_watch(char *lo, uint64_t len);
RTK_HIDDEN void rtk_tier_heat_fork_child(void);
/* tier_worker.c: at each step mark (after the step count moved): arm the heat at the first, start the worker, and
 * signal it when a pass is due (the pass runs in the mark where no worker runs). */
RTK_HIDDEN void rtk_tier_heat_mark(void);

/* A point of a heat pass where it holds the pass lock and nothing else: it gives the lock up while a fork's prepare
 * handler or (hold_here) a test asks, and returns 1 when the process exits (the pass ends now). */
static inline int rtk_tier_pass_point(int hold_here)
{
    for (;;) {
        if (__atomic_load_n(&rtk_tier.pass_stop, __ATOMIC_ACQUIRE))
            return 1;
        uint32_t *word = __atomic_load_n(&rtk_tier.pass_pause, __ATOMIC_ACQUIRE) ? &rtk_tier.pass_pause
                         : hold_here && __atomic_load_n(&rtk_tier.pass_hold, __ATOMIC_ACQUIRE) ? &rtk_tier.pass_hold
                                                                                               : NULL;
        if (!word)
            return 0;
        rtk_spin_unlock(&rtk_tier.pass_lock);
        if (word == &rtk_tier.pass_hold)
            __atomic_store_n(&rtk_tier.pass_held, 1, __ATOMIC_RELEASE);
        rtk_os_futex_wait(word, 1);
        __atomic_store_n(&rtk_tier.pass_held, 0, __ATOMIC_RELEASE);
        rtk_spin_lock(&rtk_tier.pass_lock);
    }
}
/* tier_want.c: the lookahead's wanted pages. arm: the heat budget runs, `words` (one per chunk, zeroed) hold them;
 * off: nothing more is recorded (no heat, a forked child); wanted: the chunk's pages wanted by the step about to
 * run (a bit per 4 KiB page), the step count `step` after its mark. */
RTK_HIDDEN void rtk_tier_want_arm(uint64_t *words, uint64_t nchunks);
RTK_HIDDEN void rtk_tier_want_off(void);
RTK_HIDDEN uint32_t rtk_tier_wanted(uint64_t chunk, uint64_t step);

/* tier_pager.c: tier mode's own pager (tier_pager). wanted: the setting on and a pool file; start: at the first step
 * mark, before adopt (0, or -errno with the note saying why: the heads run instead); adopt: [lo, lo + len) becomes
 * the pager's (its length, or 0); forget: a freed record's range leaves it (under the live lock, before the file is
 * mapped back); mark: each step mark (a pass on the evictor thread); fork and exit as the worker's. */
typedef struct {
    uint64_t regions, adopted_bytes, data_at_adopt, adopt_errors, forgotten_bytes, limit, anon_peak;
    uint64_t filled_from_file, filled_zero, fill_ns, busy_waits, read_errors;
    uint64_t scans, scan_errors, resident_at_scan, passes, evictions, evicted_pages, evicted_holes, written_bytes;
    uint64_t move_errors, move_errno, move_shared, move_done_eexist, write_errors;
    uint64_t fetch_calls, fetch_asked, fetch_filled, fetch_busy, fetch_ns, evicted_same, filled_same;
    uint64_t fill_cpu_ns, scan_cpu_ns, evict_cpu_ns, evict_moves;  /* CPU the pager's threads spent (its waits not) */
    uint64_t fetch_same;                                              /* pages a fetch rebuilt from their word */
    uint64_t evict_walked;                /* pages the evictions' walks looked at for candidates */
    uint64_t told_pages, regions_armed, regions_scanned;  /* pages the lookahead told; regions scans write-protected, of all */
    uint64_t heat_from, first_scan_step;  /* anonymous RSS from which heat scans run; the step mark of the first */
    uint64_t growth, first_scan_near;     /* anonymous growth a step (the lower of the last two scan intervals');
                                           * 1: the first scan came by tier_pager_heat_lead */
    uint64_t back_soon;                   /* pages back in DRAM (a fault or a fetch) within two steps of their eviction */
    uint64_t room, room_by_max;           /* the limit less the anonymous memory at the start; 1: tier_pager_max set it */
    double adopt_s, scan_s, evict_s;
} rtk_tier_pager_stats_t;
RTK_HIDDEN extern rtk_tier_pager_stats_t rtk_tier_pager_stats;
RTK_HIDDEN int rtk_tier_pager_wanted(void);
RTK_HIDDEN int rtk_tier_pager_on(void);
RTK_HIDDEN int rtk_tier_pager_page_resident(uint64_t vpage);
RTK_HIDDEN const char *rtk_tier_pager_note(void);
RTK_HIDDEN int rtk_tier_pager_start(void);
RTK_HIDDEN uint64_t rtk_tier_pager_adopt(char *lo, uint64_t len);
RTK_HIDDEN void rtk_tier_pager_forget(char *lo, uint64_t len);
RTK_HIDDEN void rtk_tier_pager_mark(void);

#endif
