/* tier.c -- PMEM tier mode: with RTKIT_PMEM_PATH set, long-lived large allocations (made before the first step
 * mark, or of sizes the profiler saw outliving steps) live in a volatile rtkit PMEM pool instead of DRAM. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "common/jsonbuf.h"
#include "common/lock.h"
#include "common/options.h"
#include "common/os.h"
#include "prmalloc/tier.h"
#include "rtkit/pmem.h"

#define TIER_HDR 32                       /* size, handle, spare, tag in front of every payload */
#define TIER_MAGIC 0x7469657252544b31ull  /* mixed into the tag so a stray pointer into the pool is told apart */
#define LL_CAP 4096                       /* long-lived sizes remembered (open addressing, never removed) */

enum { T_OFF = 0, T_IDLE, T_CREATING, T_ON, T_FAILED, T_BUSY, T_CHILD };

size_t rtk_tier_min = SIZE_MAX;
int rtk_tier_pre = 1;                     /* 1 until the first step mark */

static struct {
    int state;
    char path[512];
    size_t size, min_size, resident_max, dram_head;
    int cold_hint;
    char errors[4][320];
    int nerrors;
    rtkit_pmem_pool *pool;
    char *base;
    pid_t owner;
    int plan_ready;
    char medium[16];
    char reason[1024];
    /* counters (relaxed atomics: every placed request is >= min size, so these are rare) */
    uint64_t bytes, peak, allocs, frees, fallbacks, fallback_bytes, pre_allocs, pre_bytes, ll_allocs, ll_bytes;
    uint64_t bad_frees, child_frees, errors_other;
    uint64_t bytes_at_mark, steps;
    int fd;                               /* the pool file, kept open once its name is unlinked (fork remaps it) */
    uint64_t deferred_frees, gap_punches, gap_bytes, cold_hint_bytes;
    /* DRAM heads (pmem_dram_head): what the first step mark moved, the budget it had, and what it cost */
    uint64_t head_budget, head_bytes, head_copied, head_records, head_restored, heads_at_mark, head_punch_errors;
    uint64_t head_kept_errors;            /* freed records whose head could not be given back: never reused */
    int forked_before_heads;              /* a child may still map the pool's file pages privately */
    double head_s;
} T;

/* Live pool records, for punching free space once at the first step mark and for the per-record view.
 * Index i of a record is kept in its tier header (hd[2]); a free swaps the last entry into its place. */
#define LIVE_CAP (1u << 20)
/* resident: the record's file pages in DRAM; head_resident: its DRAM head's pages */
typedef struct { char *rec; uint64_t len; char *payload; uint64_t n; uint64_t resident, head, head_resident; } live_t;
static live_t *g_live;
static uint32_t g_nlive;
static uint64_t g_high;                   /* highest record end ever handed out (offset from base) */
static rtk_spin_t g_live_lock = RTK_SPIN_INIT;
static int g_exiting;
static int g_live_overflow;

static uint64_t g_ll[LL_CAP];
static unsigned g_ll_n;
static __thread int t_in_tier __attribute__((tls_model("initial-exec")));

static inline uint64_t ll_hash(uint64_t s) { return (s * 0x9E3779B97F4A7C15ull) >> 52; }  /* 12 bits */

static int ll_has(uint64_t s)
{
    for (unsigned i = (unsigned)ll_hash(s), k = 0; k < LL_CAP; k++, i = (i + 1) & (LL_CAP - 1)) {
        uint64_t v = __atomic_load_n(&g_ll[i], __ATOMIC_RELAXED);
        if (v == s)
            return 1;
        if (!v)
            return 0;
    }
    return 0;
}

static void note_longlived(size_t size)
{
    if (size < rtk_tier_min || g_ll_n >= LL_CAP / 4 * 3)
        return;
    for (unsigned i = (unsigned)ll_hash(size);; i = (i + 1) & (LL_CAP - 1)) {
        if (g_ll[i] == size)
            return;
        if (!g_ll[i]) {
            __atomic_store_n(&g_ll[i], (uint64_t)size, __ATOMIC_RELAXED);
            g_ll_n++;
            return;
        }
    }
}

/* pointers carried at the previous and at this boundary (only while profiling with tier mode on) */
#define CARRY_CAP 8192
static uintptr_t g_carry[2][CARRY_CAP];
static int g_carry_cur;

static int carry_find_or_add(uintptr_t *tab, uintptr_t p, int add)
{
    for (unsigned i = (unsigned)(((p >> 4) * 0x9E3779B97F4A7C15ull) >> 51), k = 0; k < CARRY_CAP / 4 * 3;
         k++, i = (i + 1) & (CARRY_CAP - 1)) {
        if (tab[i] == p)
            return 1;
        if (!tab[i]) {
            if (add)
                tab[i] = p;
            return 0;
        }
    }
    return 0;
}

void rtk_tier_note_carried(uintptr_t p, size_t size)
{
    if (size < rtk_tier_min)
        return;
    if (carry_find_or_add(g_carry[!g_carry_cur], p, 0))
        note_longlived(size);
    carry_find_or_add(g_carry[g_carry_cur], p, 1);
}

void rtk_tier_carry_done(void)
{
    g_carry_cur = !g_carry_cur;
    memset(g_carry[g_carry_cur], 0, sizeof g_carry[0]);
}

void rtk_tier_plan_ready(void) { __atomic_store_n(&T.plan_ready, 1, __ATOMIC_RELEASE); }

int rtk_tier_prestep(void) { return rtk_tier_pre; }

/* ---------------------------------------------------------------- settings and the pool */
void rtk_tier_read_settings(void)
{
    const char *path = rtk_opt_str(RTK_OPT_PMEM_PATH);
    T.fd = -1;
    /* each bad value: its message is kept, said once per run when the pool is opened, and the default applies */
#define RECORD(call) do { rtk_opt_set_error_sink(T.errors[T.nerrors < 4 ? T.nerrors : 3], sizeof T.errors[0]); \
                          if ((call) != 0 && T.nerrors < 4) T.nerrors++; } while (0)
    RECORD(rtk_opt_size(RTK_OPT_PMEM_SIZE, &T.size));
    RECORD(rtk_opt_size(RTK_OPT_PMEM_MIN_SIZE, &T.min_size));
    RECORD(rtk_opt_size(RTK_OPT_PMEM_RESIDENT_MAX, &T.resident_max));
    RECORD(rtk_opt_bool(RTK_OPT_PMEM_COLD_HINT, &T.cold_hint));
    RECORD(rtk_opt_size(RTK_OPT_PMEM_DRAM_HEAD, &T.dram_head));
    rtk_opt_set_error_sink(NULL, 0);
    if (!path || strlen(path) >= sizeof T.path) {
        if (path)
            snprintf(T.reason, sizeof T.reason, "%s is longer than %zu bytes", rtk_settings[RTK_OPT_PMEM_PATH].env,
                     sizeof T.path - 1);
        T.state = path ? T_FAILED : T_OFF;
        return;
    }
    snprintf(T.path, sizeof T.path, "%s", path);
    T.state = T_IDLE;
    rtk_tier_min = T.min_size;
}

/* One line per run on stderr: the first process of the tree that meets the problem says it. */
static void say(const char *msg)
{
    const char *dir = rtk_opt_internal(RTK_ENV_RUN_DIR);
    if (dir) {
        char marker[1200];
        snprintf(marker, sizeof marker, "%s/.pmem-path-reported", dir);
        int fd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno == EEXIST)
            return;
        if (fd >= 0)
            close(fd);
    }
    rtk_log_line("%s", msg);
}

/* Safety rule (docs/safety.md): rtkit never deletes or truncates a file it did not create in this run. The tier
 * pool is scratch that this process creates (O_EXCL) and removes at exit; any file already at the path (a durable
 * pool made with the Python API, a stale pool, /proc/self/mem) is left alone and tier mode stays off with one
 * line. 0: go ahead; 1: busy (a live process holds a pool there); -1: refuse (reason set). */
static int clear_old(void)
{
    struct stat st;
    if (lstat(T.path, &st) != 0)
        return 0;  /* absent (or unreachable: create says why) */
    int fd = S_ISREG(st.st_mode) ? open(T.path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0) {
        close(fd);
        return 1;
    }
    if (fd >= 0)
        close(fd);
    snprintf(T.reason, sizeof T.reason,
             "%s exists; tier mode never reuses or deletes a file it did not create: remove it or choose a new "
             "path", T.path);
    return -1;
}

static void tier_open(void)
{
    int expect = T_IDLE;
    if (!__atomic_compare_exchange_n(&T.state, &expect, T_CREATING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;  /* another thread is creating it (its requests meanwhile stay in DRAM) or it is settled */
    t_in_tier = 1;
    for (int i = 0; i < T.nerrors; i++)
        say(T.errors[i]);
    int st = clear_old();
    int next = T_FAILED;
    if (st == 1) {
        snprintf(T.reason, sizeof T.reason, "%s is held by another process; this process keeps its memory in DRAM",
                 T.path);
        next = T_BUSY;
    } else if (st == 0) {
        rtkit_pmem_options o;
        rtkit_pmem_options_init(&o);
        o.durable = 0;  /* scratch: DeepRec's volatile mode, no per-record flush */
        rtkit_pmem_pool *pool = NULL;
        int rc = rtkit_pmem_create(T.path, T.size, &o, &pool);
        if (rc == 0) {
            rtkit_pmem_stats s;
            rtkit_pmem_stats_get(pool, &s);
            T.pool = pool;
            T.base = rtkit_pmem_base(pool);
            T.size = s.pool_size;
            T.owner = getpid();
            struct statfs sf;
            int ram = statfs(T.path, &sf) == 0 && (sf.f_type == 0x01021994 || sf.f_type == 0x858458f6);
            snprintf(T.medium, sizeof T.medium, "%s", s.is_pmem ? "pmem" : ram ? "tmpfs" : "file");
            /* tensors are not read sequentially through the file: no read-ahead into untouched extents */
            madvise(T.base, s.pool_size, MADV_RANDOM);
            void *lt = mmap(NULL, LIVE_CAP * sizeof(live_t), PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            g_live = lt == MAP_FAILED ? NULL : lt;
            /* scratch: the name goes now, so neither a crash nor kill -9 leaves a pool file behind, and the
             * pages still dirty at exit are dropped with the inode instead of written (fork remaps by fd) */
            T.fd = open(T.path, O_RDWR | O_CLOEXEC);
            if (T.fd >= 0)
                unlink(T.path);
            /* publish the range before anything can be placed: a free must always recognise pool memory */
            __atomic_store_n(&rtk_hot.tier_lo, (uintptr_t)T.base, __ATOMIC_RELEASE);
            __atomic_store_n(&rtk_hot.tier_span, (uintptr_t)s.pool_size, __ATOMIC_RELEASE);
            rtk_publish_any();
            next = T_ON;
        } else {
            snprintf(T.reason, sizeof T.reason, "%s", rtkit_pmem_last_error());
        }
    }
    if (next == T_FAILED) {
        char line[1200];
        snprintf(line, sizeof line, "%s: %s; tier mode off, allocations stay in DRAM",
                 rtk_settings[RTK_OPT_PMEM_PATH].env, T.reason);
        say(line);
        rtk_tier_min = SIZE_MAX;
    }
    __atomic_store_n(&T.state, next, __ATOMIC_RELEASE);
    t_in_tier = 0;
}

/* ---------------------------------------------------------------- allocation */
static inline void add_bytes(uint64_t n)
{
    uint64_t now = __atomic_add_fetch(&T.bytes, n, __ATOMIC_RELAXED);
    uint64_t peak = __atomic_load_n(&T.peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&T.peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static inline uint64_t tag_of(uint64_t h, const void *q) { return h ^ TIER_MAGIC ^ ((uintptr_t)q * 0x9E3779B97F4A7C15ull); }

void *rtk_tier_alloc(size_t n, size_t align, int zero, int longlived)
{
    if (t_in_tier)
        return NULL;  /* the pool's own set-up (libpmem, thread creation) allocates: DRAM */
    if (longlived ? !__atomic_load_n(&T.plan_ready, __ATOMIC_ACQUIRE) || !ll_has(n) : !rtk_tier_pre)
        return NULL;
    int st = __atomic_load_n(&T.state, __ATOMIC_ACQUIRE);
    if (st != T_ON) {
        if (st != T_IDLE)
            return NULL;
        tier_open();
        if (__atomic_load_n(&T.state, __ATOMIC_ACQUIRE) != T_ON)
            return NULL;
    }
    size_t a = align > 16 ? align : 16, need;
    if (__builtin_add_overflow(n, TIER_HDR + a, &need))
        return NULL;
    uint64_t h;
    t_in_tier = 1;
    /* under the live lock: the first step mark punches what is not a live record */
    rtk_spin_lock(&g_live_lock);
    int rc = rtkit_pmem_alloc(T.pool, need, &h);
    if (rc != 0)
        rtk_spin_unlock(&g_live_lock);
    t_in_tier = 0;
    if (rc != 0) {
        if (rc == RTKIT_PMEM_ENOSPC || rc == RTKIT_PMEM_ETOOBIG) {
            __atomic_add_fetch(&T.fallbacks, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&T.fallback_bytes, n, __ATOMIC_RELAXED);
        } else {
            __atomic_add_fetch(&T.errors_other, 1, __ATOMIC_RELAXED);
        }
        return NULL;
    }
    char *p = rtkit_pmem_ptr(T.pool, h);
    char *q = (char *)(((uintptr_t)p + TIER_HDR + a - 1) & ~(uintptr_t)(a - 1));
    uint64_t *hd = (uint64_t *)(q - TIER_HDR);
    hd[0] = n;
    hd[1] = h;
    hd[2] = UINT64_MAX;
    hd[3] = tag_of(h, q);
    uint64_t req, usable;
    if (rtkit_pmem_record_size(T.pool, h, &req, &usable) != 0)
        usable = need;
    if ((uint64_t)(p - T.base) + usable > g_high)
        g_high = (uint64_t)(p - T.base) + usable;
    if (g_live && g_nlive < LIVE_CAP) {
        g_live[g_nlive] = (live_t){p, usable, q, n, 0, 0, 0};
        hd[2] = g_nlive++;
    } else {
        g_live_overflow = 1;  /* an untracked record: the first step mark must not punch around the table */
    }
    rtk_spin_unlock(&g_live_lock);
    if (zero)
        memset(q, 0, n);  /* a reused extent holds old data */
    __atomic_add_fetch(&T.allocs, 1, __ATOMIC_RELAXED);
    if (longlived) {
        __atomic_add_fetch(&T.ll_allocs, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&T.ll_bytes, n, __ATOMIC_RELAXED);
    } else {
        __atomic_add_fetch(&T.pre_allocs, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&T.pre_bytes, n, __ATOMIC_RELAXED);
    }
    add_bytes(n);
    return q;
}

/* the tier header of p, or NULL when p is not a payload this file handed out */
static uint64_t *header_of(const void *p)
{
    if (!T.base || ((uintptr_t)p & 15) || (const char *)p < T.base + 4096 + TIER_HDR)
        return NULL;
    uint64_t *hd = (uint64_t *)((const char *)p - TIER_HDR);
    if (hd[3] != tag_of(hd[1], p))
        return NULL;
    return hd;
}

/* Give the whole pages of a freed payload back to the file system (a hole: tmpfs memory or page cache freed),
 * as glibc unmaps a large chunk on free; otherwise every page the pool ever touched stays resident. Done before
 * the record is freed, so no other thread can own it yet. The headers lie below the first whole page. */
static int g_no_remove;
static uint64_t g_remove_errors;

static void release_pages(void *p, uint64_t n, uint64_t h)
{
    if (g_no_remove || g_exiting)
        return;  /* at exit the whole file goes at once */
    if (rtk_tier_pre) {
        /* graph construction churns the pool: the next record reuses these pages (no new fault, no new dirty
         * page); what is still free at the first step mark is punched then */
        __atomic_add_fetch(&T.deferred_frees, 1, __ATOMIC_RELAXED);
        return;
    }
    /* to the end of the record, not of the payload: file read-ahead may have brought in pages past it */
    uint64_t req, usable;
    uintptr_t end = (uintptr_t)p + n;
    if (rtkit_pmem_record_size(T.pool, h, &req, &usable) == 0)
        end = (uintptr_t)rtkit_pmem_ptr(T.pool, h) + usable;
    uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, hi = end & ~(uintptr_t)4095;
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_REMOVE) != 0) {
        if (errno == EOPNOTSUPP || errno == EINVAL)
            g_no_remove = 1;  /* the file system cannot punch holes: keep the pages */
        else
            __atomic_add_fetch(&g_remove_errors, 1, __ATOMIC_RELAXED);
    }
}

/* ---------------------------------------------------------------- DRAM heads (pmem_dram_head)
 * A record's head is its first whole pages, remapped as private anonymous memory over the pool's shared file
 * mapping: the same addresses, so pointers into the table stay valid, but its pages are never dirty in the page
 * cache, never written back and never evicted. Writeback of hot rows rewritten every step was the largest cost of
 * a pool on disk (docs/pmem.md, "Full scale"). */
#define HEAD_MIN ((uint64_t)1 << 20)     /* records smaller than this keep no head */
#define HEAD_CHUNK ((uint64_t)64 << 20)  /* copied and remapped this much at a time: bounded transient memory */
#define HEAD_CAP 4096                    /* records with a head at most (fork remaps around each) */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline char *head_lo(const char *payload) { return (char *)(((uintptr_t)payload + 4095) & ~(uintptr_t)4095); }

/* Give a freed record's head back to the pool file (under the live lock, with its entry): the pool may place any
 * record there next, and everything in the pool must be the file's pages (fork, the budget and hole punching
 * assume it). -1: it stays anonymous, and the record must not be reused. */
static int restore_head(live_t *r)
{
    if (!r->head)
        return 0;
    char *lo = head_lo(r->payload);
    if (mmap(lo, r->head, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, T.fd, (off_t)(lo - T.base)) == MAP_FAILED)
        return -1;
    madvise(lo, r->head, MADV_RANDOM);  /* as the rest of the pool */
    T.head_restored += r->head;
    r->head = 0;
    return 0;
}

static int all_zero(const char *p, uint64_t n)
{
    const uint64_t *w = (const uint64_t *)p;
    uint64_t acc = 0;
    for (uint64_t i = 0; i < n / 8; i++)
        acc |= w[i];
    for (uint64_t i = n & ~(uint64_t)7; i < n; i++)
        acc |= (unsigned char)p[i];
    return acc == 0;
}

/* The file's data in [off, off + len) into dst, whose pages start untouched (zero, not resident): only pages with
 * a non-zero byte are written, so the head's anonymous pages grow with the rows in use, as the file's did. Data
 * extents only, where the file system tells them apart (a sparse file; a preallocated one reports its unwritten
 * extents as data, and reading those costs a zero page each). */
static uint64_t copy_data(char *dst, uint64_t off, uint64_t len)
{
    uint64_t copied = 0, end = off + len;
    for (uint64_t pos = off; pos < end;) {
        off_t d = lseek(T.fd, (off_t)pos, SEEK_DATA);
        if (d < 0 && errno == ENXIO)
            break;  /* no data past pos */
        off_t h = d < 0 ? -1 : lseek(T.fd, d, SEEK_HOLE);
        if (d < 0 || h < 0) {
            d = (off_t)pos, h = (off_t)end;  /* the file system cannot tell: look at it all */
        }
        if ((uint64_t)d >= end)
            break;
        uint64_t stop = (uint64_t)h < end ? (uint64_t)h : end;
        for (uint64_t a = (uint64_t)d; a < stop;) {
            uint64_t next = ((a & ~(uint64_t)4095) + 4096) < stop ? (a & ~(uint64_t)4095) + 4096 : stop;
            if (!all_zero(T.base + a, next - a)) {
                memcpy(dst + (a - off), T.base + a, next - a);
                copied += next - a;
            }
            a = next;
        }
        pos = stop;
    }
    return copied;
}

/* Move [lo, lo + len) of the pool to anonymous memory, a chunk at a time; returns the bytes moved (a prefix). */
static uint64_t move_to_dram(char *lo, uint64_t len)
{
    uint64_t done = 0;
    while (done < len) {
        uint64_t c = len - done < HEAD_CHUNK ? len - done : HEAD_CHUNK, off = (uint64_t)(lo - T.base) + done;
        char *tmp = mmap(NULL, c, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (tmp == MAP_FAILED)
            break;
        T.head_copied += copy_data(tmp, off, c);
        if (mremap(tmp, c, c, MREMAP_MAYMOVE | MREMAP_FIXED, lo + done) == MAP_FAILED) {
            munmap(tmp, c);
            break;
        }
        /* the file's copy goes: no page cache, no disk blocks, nothing to write back; not while a child forked
         * before this mark may still read these pages through its private view of the file */
        if (T.forked_before_heads ||
            fallocate(T.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)c) != 0)
            T.head_punch_errors++;
        done += c;
    }
    return done;
}

/* At the first step mark, under the live lock (no record is placed or freed meanwhile; the job is between
 * steps, so no kernel writes a table): every record of HEAD_MIN or more gets the same leading share, the budget
 * over their total bytes. With rows in first-seen order, a table's first rows are its most used ones. */
static void make_heads(void)
{
    if (!T.dram_head || T.state != T_ON || !g_live || T.fd < 0)
        return;
    double t0 = mono_s();
    uint64_t budget = T.dram_head, avail = rtk_os_mem_available();
    if (avail != SIZE_MAX && budget > avail / 2)
        budget = avail / 2;  /* anonymous pages cannot be reclaimed without swap: leave the page cache room */
    T.head_budget = budget;
    rtk_spin_lock(&g_live_lock);
    uint64_t total = 0;
    for (uint32_t i = 0, k = 0; i < g_nlive && k < HEAD_CAP; i++)
        if (g_live[i].n >= HEAD_MIN && !g_live[i].head)
            total += g_live[i].n, k++;
    double share = total <= budget ? 1.0 : (double)budget / (double)total;
    for (uint32_t i = 0; i < g_nlive && T.head_records < HEAD_CAP; i++) {
        live_t *r = &g_live[i];
        if (r->n < HEAD_MIN || r->head)
            continue;
        char *lo = head_lo(r->payload), *end = (char *)(((uintptr_t)r->payload + r->n) & ~(uintptr_t)4095);
        uint64_t want = (uint64_t)((double)(end - lo) * share) & ~(uint64_t)4095;
        if (end <= lo || want < HEAD_MIN / 4 || T.head_bytes + want > budget)
            continue;
        r->head = move_to_dram(lo, want);
        if (r->head) {
            T.head_bytes += r->head;
            T.head_records++;
        }
    }
    rtk_spin_unlock(&g_live_lock);
    T.head_s = mono_s() - t0;
}

void rtk_tier_free(void *p)
{
    if (__builtin_expect(T.state == T_CHILD, 0)) {
        /* a forked child sees a private copy of the pool: giving records back would free the parent's */
        __atomic_add_fetch(&T.child_frees, 1, __ATOMIC_RELAXED);
        return;
    }
    uint64_t *hd = header_of(p);
    if (!hd) {
        __atomic_add_fetch(&T.bad_frees, 1, __ATOMIC_RELAXED);
        return;
    }
    uint64_t n = hd[0], h = hd[1];
    hd[3] = 0;  /* a second free of p no longer matches */
    /* Out of the live set, and its head given back, in one hold of the lock: the first mark's heads are made
     * under it, so a record is either seen there whole or not at all. */
    t_in_tier = 1;
    rtk_spin_lock(&g_live_lock);
    uint64_t i = hd[2];
    int kept = 0;
    if (g_live && i < g_nlive && g_live[i].payload == (char *)p) {
        kept = restore_head(&g_live[i]) != 0;
        g_live[i] = g_live[--g_nlive];
        if (i < g_nlive)
            ((uint64_t *)(g_live[i].payload - TIER_HDR))[2] = i;
    }
    rtk_spin_unlock(&g_live_lock);
    if (kept) {  /* an anonymous range inside the pool: leaked rather than handed out as pool memory */
        t_in_tier = 0;
        __atomic_add_fetch(&T.head_kept_errors, 1, __ATOMIC_RELAXED);
        return;
    }
    release_pages(p, n, h);
    rtk_spin_lock(&g_live_lock);
    int rc = rtkit_pmem_free(T.pool, h);
    rtk_spin_unlock(&g_live_lock);
    t_in_tier = 0;
    if (rc != 0) {
        __atomic_add_fetch(&T.bad_frees, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_add_fetch(&T.frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&T.bytes, n, __ATOMIC_RELAXED);
}

size_t rtk_tier_usable(const void *p)
{
    uint64_t *hd = header_of(p);
    return hd ? (size_t)hd[0] : 0;
}

int rtk_tier_keeps(void *p, size_t n, size_t *old)
{
    uint64_t *hd = header_of(p);
    if (!hd) {
        __atomic_add_fetch(&T.bad_frees, 1, __ATOMIC_RELAXED);
        return -1;
    }
    *old = (size_t)hd[0];
    /* a mild shrink keeps the record (malloc_usable_size still reports the old size) */
    return n <= *old && n >= *old / 2 && T.state != T_CHILD;
}

/* ---------------------------------------------------------------- step marks, fork, exit */
/* sort (start, end) pairs by start: a heap sort, since qsort may call malloc */
static void sort_ranges(uint64_t (*r)[2], long n)
{
    for (long k = n / 2 - 1, end = n; end > 1 || k >= 0;) {
        long i;
        if (k >= 0)
            i = k--;
        else {
            end--;
            uint64_t t0 = r[0][0], t1 = r[0][1];
            r[0][0] = r[end][0], r[0][1] = r[end][1], r[end][0] = t0, r[end][1] = t1;
            i = 0;
        }
        for (long c; (c = 2 * i + 1) < end; i = c) {
            if (c + 1 < end && r[c + 1][0] > r[c][0])
                c++;
            if (r[i][0] >= r[c][0])
                break;
            uint64_t t0 = r[i][0], t1 = r[i][1];
            r[i][0] = r[c][0], r[i][1] = r[c][1], r[c][0] = t0, r[c][1] = t1;
        }
    }
}

/* At the first step mark: punch every whole page of the pool's used span that no live record covers (the pages
 * that pre-step frees left behind), under the live lock so no record is placed meanwhile. */
static void punch_free_space(void)
{
    if (T.state != T_ON || !g_live || g_no_remove || g_live_overflow)
        return;
    rtk_spin_lock(&g_live_lock);
    uint32_t n = g_nlive;
    size_t len = ((size_t)n + 1) * 16;
    uint64_t (*r)[2] = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) {
        rtk_spin_unlock(&g_live_lock);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        r[i][0] = (uint64_t)(g_live[i].rec - T.base);
        r[i][1] = r[i][0] + g_live[i].len;
    }
    sort_ranges(r, n);
    rtkit_pmem_stats s;
    rtkit_pmem_stats_get(T.pool, &s);
    uint64_t cur = s.data_offset;
    for (uint32_t i = 0; i <= n; i++) {
        uint64_t next = i < n ? r[i][0] : g_high;
        uint64_t lo = (cur + 4095) & ~4095ull, hi = next & ~4095ull;
        if (hi > lo) {
            if (madvise(T.base + lo, hi - lo, MADV_REMOVE) == 0) {
                T.gap_punches++;
                T.gap_bytes += hi - lo;
            } else if (errno == EOPNOTSUPP || errno == EINVAL) {
                g_no_remove = 1;
                break;
            }
        }
        if (i < n && r[i][1] > cur)
            cur = r[i][1];
    }
    /* What the profiler saw so far is initialisation: every pool page was written by it, and the steps will
     * touch only some. Deactivate them all once: the pages the steps touch are referenced again and stay
     * active, the ones only the initialisers wrote are the first the kernel reclaims under pressure. */
    if (T.cold_hint && g_high > s.data_offset && madvise(T.base + s.data_offset, g_high - s.data_offset, MADV_COLD) == 0)
        T.cold_hint_bytes = g_high - s.data_offset;
    rtk_spin_unlock(&g_live_lock);
    munmap(r, len);
}

void rtk_tier_step_mark(void)
{
    if (__atomic_load_n(&rtk_tier_pre, __ATOMIC_RELAXED) && __atomic_exchange_n(&rtk_tier_pre, 0, __ATOMIC_ACQ_REL)) {
        punch_free_space();
        make_heads();  /* after the cold hint: heads are hot by design */
    }
    rtk_tier_pre = 0;
    T.steps++;
    T.bytes_at_mark = __atomic_load_n(&T.bytes, __ATOMIC_RELAXED);
    T.heads_at_mark = T.head_bytes - T.head_restored;
}

/* fork waits for the live lock (a mark making heads holds it): the child then sees every moved range recorded */
static int g_fork_locked;

void rtk_tier_fork_prepare(void)
{
    g_fork_locked = __atomic_load_n(&T.state, __ATOMIC_ACQUIRE) == T_ON;
    if (!g_fork_locked)
        return;
    rtk_spin_fork_prepare(&g_live_lock);
    if (__atomic_load_n(&rtk_tier_pre, __ATOMIC_RELAXED))
        T.forked_before_heads = 1;  /* the child's private view reads the file: heads must not punch it */
}

void rtk_tier_fork_parent(void)
{
    if (g_fork_locked)
        rtk_spin_fork_parent(&g_live_lock);
}

void rtk_tier_fork_child(void)
{
    rtk_tier_min = SIZE_MAX;
    if (T.state != T_ON)
        return;
    rtk_spin_fork_child(&g_live_lock);
    /* the pool is MAP_SHARED: turn the child's view into a private copy so its writes stay its own (through
     * the kept descriptor: the file's name is gone) */
    int fd = T.fd >= 0 ? T.fd : open(T.path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        /* around the DRAM heads: fork already gave the child its own copy of those */
        static uint64_t heads[HEAD_CAP][2];
        long nh = 0;
        for (uint32_t i = 0; T.head_records && g_live && i < g_nlive && nh < HEAD_CAP; i++)
            if (g_live[i].head) {
                heads[nh][0] = (uint64_t)(head_lo(g_live[i].payload) - T.base);
                heads[nh][1] = heads[nh][0] + g_live[i].head;
                nh++;
            }
        sort_ranges(heads, nh);
        uint64_t cur = 0;
        for (long i = 0; i <= nh; i++) {
            uint64_t next = i < nh ? heads[i][0] : T.size;
            if (next > cur && mmap(T.base + cur, next - cur, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd,
                                   (off_t)cur) == MAP_FAILED)
                snprintf(T.reason, sizeof T.reason, "forked child: pool view stays shared (%s)", strerror(errno));
            if (i < nh)
                cur = heads[i][1];
        }
        if (fd != T.fd)
            close(fd);
    }
    T.state = T_CHILD;
}

void rtk_tier_exit(void)
{
    /* scratch: the file goes with the process (the mapping stays valid for frees still to come; they no longer
     * punch pages: the inode's pages are dropped at once when the process ends) */
    g_exiting = 1;
    if (T.state == T_ON && T.owner == getpid() && T.fd < 0)
        unlink(T.path);
}

#define U(x) ((unsigned long long)(x))
#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

/* ---------------------------------------------------------------- residency over time (the tier view) */
/* A sample per stats write (step marks, at most every 0.5 s, and exit), at most one a second: which pool pages
 * are in DRAM now (mincore over every live record) and the process's major faults. */
#define TL_CAP 1024
typedef struct { uint64_t step; double t_s; uint64_t resident, tier_bytes, major_faults; } tl_t;
static tl_t g_tl[TL_CAP];
static unsigned g_ntl;                    /* samples taken; the ring keeps the last TL_CAP */
static uint64_t g_resident;
static double g_t0, g_tl_last;
static unsigned char *g_vec;
#define VEC_PAGES (1u << 16)              /* mincore vector: 256 MiB of pool per call */

static uint64_t resident_of(char *lo, uint64_t len)
{
    uint64_t pages = 0;
    uintptr_t a = (uintptr_t)lo & ~(uintptr_t)4095, end = (uintptr_t)lo + len;
    while (a < end) {
        uint64_t n = (end - a + 4095) / 4096;
        if (n > VEC_PAGES)
            n = VEC_PAGES;
        if (mincore((void *)a, n * 4096, g_vec) != 0)
            return pages * 4096;
        for (uint64_t i = 0; i < n; i++)
            pages += g_vec[i] & 1;
        a += n * 4096;
    }
    return pages * 4096;
}

/* the record's pool file pages in DRAM: all of it but its DRAM head */
static uint64_t file_resident(const live_t *r)
{
    if (!r->head)
        return resident_of(r->payload, r->n);
    char *lo = head_lo(r->payload), *hi = lo + r->head, *end = r->payload + r->n;
    return (lo > r->payload ? resident_of(r->payload, (uint64_t)(lo - r->payload)) : 0) +
           (end > hi ? resident_of(hi, (uint64_t)(end - hi)) : 0);
}

/* Over the resident budget: write out and drop records, round-robin from where the last pass stopped, until a
 * quarter of the budget is free (the pages the next steps touch come back as major faults: the hot set). */
static uint32_t g_evict_cursor;
static uint64_t g_evictions, g_evicted_bytes;

static uint64_t enforce_budget(uint64_t total)
{
    uint64_t goal = T.resident_max / 4 * 3;
    rtk_spin_lock(&g_live_lock);
    /* one pass drops only part of what it asks for (pages still under writeback, or referenced again meanwhile):
     * a few passes while they make progress */
    for (int pass = 0; pass < 4 && total > goal; pass++) {
        uint64_t before = total;
        for (uint32_t k = 0; k < g_nlive && total > goal; k++) {
            uint32_t i = (g_evict_cursor + k) % g_nlive;
            live_t *r = &g_live[i];
            if (!r->resident)
                continue;
            /* past the DRAM head: with swap, MADV_PAGEOUT would send its anonymous pages there */
            uintptr_t lo = r->head ? (uintptr_t)head_lo(r->payload) + r->head : (uintptr_t)r->payload & ~(uintptr_t)4095;
            uintptr_t hi = ((uintptr_t)r->payload + r->n + 4095) & ~(uintptr_t)4095;
            if (hi <= lo)
                continue;
            uint64_t len = hi - lo;
            if (T.fd >= 0)  /* dirty pages must reach the file before the kernel can drop them */
                sync_file_range(T.fd, (off64_t)(lo - (uintptr_t)T.base), (off64_t)len,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
            madvise((void *)lo, len, MADV_PAGEOUT);
            uint64_t now = file_resident(r);
            g_evicted_bytes += r->resident > now ? r->resident - now : 0;
            total -= r->resident > now ? r->resident - now : 0;
            r->resident = now;
            g_evict_cursor = i + 1;
        }
        if (total >= before)
            break;
    }
    g_evictions++;
    rtk_spin_unlock(&g_live_lock);
    return total;
}

#define TOP_N 16
static live_t g_top[TOP_N];
static int g_ntop;
static int top_records(live_t *out);

static void sample_residency(int force)
{
    if (T.state != T_ON || !g_live)
        return;
    double now = mono_s();
    if (!g_t0)
        g_t0 = now;
    if (!force && g_ntl && now - g_tl_last < 1.0)
        return;
    if (!g_vec) {
        void *v = mmap(NULL, VEC_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (v == MAP_FAILED)
            return;
        g_vec = v;
    }
    g_tl_last = now;
    uint64_t total = 0;
    rtk_spin_lock(&g_live_lock);
    for (uint32_t i = 0; i < g_nlive; i++) {
        live_t *r = &g_live[i];
        r->resident = file_resident(r);
        r->head_resident = r->head ? resident_of(head_lo(r->payload), r->head) : 0;
        total += r->resident;
    }
    rtk_spin_unlock(&g_live_lock);
    if (T.resident_max && total > T.resident_max)
        total = enforce_budget(total);
    g_resident = total;
    /* the records while training runs (at exit the job has already freed most of them) */
    if (LD(T.bytes) >= LD(T.bytes_at_mark) / 2)
        g_ntop = top_records(g_top);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    g_tl[g_ntl % TL_CAP] = (tl_t){T.steps, now - g_t0, total, LD(T.bytes), (uint64_t)ru.ru_majflt};
    g_ntl++;
}

/* the largest live records (at most 16), largest first, into out; returns how many */
static int top_records(live_t *out)
{
    int k = 0;
    rtk_spin_lock(&g_live_lock);
    for (uint32_t i = 0; g_live && i < g_nlive; i++) {
        live_t r = g_live[i];
        int j = k < TOP_N ? k++ : TOP_N;
        if (j == TOP_N && r.n <= out[TOP_N - 1].n)
            continue;
        if (j == TOP_N)
            j = TOP_N - 1;
        while (j > 0 && out[j - 1].n < r.n) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = r;
    }
    rtk_spin_unlock(&g_live_lock);
    return k;
}

/* ---------------------------------------------------------------- report */
static const char *state_name(int s)
{
    switch (s) {
    case T_IDLE: return "idle";
    case T_CREATING: return "creating";
    case T_ON: return "on";
    case T_FAILED: return "failed";
    case T_BUSY: return "busy";
    case T_CHILD: return "forked_child";
    default: return "off";
    }
}

/* RssAnon / RssFile / RssShmem of this process, in bytes (-1 when unknown) */
static void rss_parts(long long out[3])
{
    static const char *keys[3] = {"RssAnon:", "RssFile:", "RssShmem:"};
    char buf[8192];
    out[0] = out[1] = out[2] = -1;
    if (rtk_os_read_file("/proc/self/status", buf, sizeof buf) < 0)
        return;
    for (int i = 0; i < 3; i++) {
        const char *s = strstr(buf, keys[i]);
        if (s)
            out[i] = atoll(s + strlen(keys[i])) * 1024;
    }
}


/* the share of a record in DRAM: its file pages and its head's */
static double hot_fraction(const live_t *r)
{
    uint64_t in = r->resident + r->head_resident;
    return r->n ? (in >= r->n ? 1.0 : (double)in / (double)r->n) : 0.0;
}

long rtk_tier_format(char *buf, size_t cap, int indent)
{
    rtk_out_t o = {buf, cap, 0, 0};
    const char *nl = indent ? "\n  " : " ";
    int st = __atomic_load_n(&T.state, __ATOMIC_ACQUIRE);
    rtk_out_put(&o, "{%s\"schema_version\": 1,%s\"pid\": %ld,%s\"state\": \"%s\",%s\"pmem_path\": ", nl, nl, (long)getpid(), nl,
        state_name(st), nl);
    rtk_out_str(&o, T.path);
    rtk_out_put(&o, ",%s\"medium\": ", nl);
    rtk_out_str(&o, T.medium);
    rtk_out_put(&o, ",%s\"pmem_size\": %llu,%s\"pmem_min_size\": %llu,%s\"durable\": false,", nl,
        U(st == T_OFF ? 0 : T.size), nl, U(T.min_size), nl);
    uint64_t bytes = LD(T.bytes), mark = LD(T.bytes_at_mark);
    rtk_out_put(&o, "%s\"tier_bytes\": %llu,%s\"tier_peak_bytes\": %llu,%s\"tier_last_step_bytes\": %llu,", nl, U(bytes),
        nl, U(LD(T.peak)), nl, U(mark));
    rtk_out_put(&o, "%s\"tier_allocs\": %llu,%s\"tier_frees\": %llu,%s\"tier_fallbacks\": %llu,%s\"tier_fallback_bytes\": %llu,",
        nl, U(LD(T.allocs)), nl, U(LD(T.frees)), nl, U(LD(T.fallbacks)), nl, U(LD(T.fallback_bytes)));
    rtk_out_put(&o, "%s\"placed_before_first_step\": {\"allocs\": %llu, \"bytes\": %llu},"
            "%s\"placed_long_lived\": {\"allocs\": %llu, \"bytes\": %llu, \"sizes_known\": %u, \"active\": %s},",
        nl, U(LD(T.pre_allocs)), U(LD(T.pre_bytes)), nl, U(LD(T.ll_allocs)), U(LD(T.ll_bytes)), g_ll_n,
        LD(T.plan_ready) ? "true" : "false");
    rtk_out_put(&o, "%s\"page_release\": {\"disabled\": %s, \"errors\": %llu, \"deferred_frees\": %llu, "
            "\"first_step_punches\": %llu, \"first_step_punched_bytes\": %llu, \"first_step_cold_hint_bytes\": %llu},", nl,
        g_no_remove ? "true" : "false", U(LD(g_remove_errors)), U(LD(T.deferred_frees)), U(T.gap_punches),
        U(T.gap_bytes), U(T.cold_hint_bytes));
    rtk_out_put(&o, "%s\"dram_head\": {\"setting_bytes\": %llu, \"budget_bytes\": %llu, \"bytes\": %llu, "
            "\"records\": %llu, \"copied_bytes\": %llu, \"restored_bytes\": %llu, \"seconds\": %.3f, "
            "\"file_copies_kept\": %llu, \"not_given_back\": %llu},", nl,
        U(T.dram_head), U(T.head_budget), U(T.head_bytes), U(T.head_records), U(T.head_copied), U(T.head_restored),
        T.head_s, U(T.head_punch_errors), U(LD(T.head_kept_errors)));
    rtk_out_put(&o, "%s\"bad_frees\": %llu,%s\"child_frees_ignored\": %llu,%s\"pool_errors\": %llu,", nl, U(LD(T.bad_frees)),
        nl, U(LD(T.child_frees)), nl, U(LD(T.errors_other)));
    /* DRAM saved: what sat in the pool at the last step mark (steady state), else what sits there now, less the
     * heads still in anonymous memory */
    uint64_t saved = T.steps ? mark : bytes, heads_live = T.steps ? T.heads_at_mark : T.head_bytes - T.head_restored;
    rtk_out_put(&o, "%s\"dram_bytes_saved_estimate\": %llu,", nl, U(saved > heads_live ? saved - heads_live : 0));
    long long rss[3];
    rss_parts(rss);
    static long long anon_peak;  /* sampled at every stats write (step marks, at most every 0.5 s, and exit) */
    if (rss[0] > anon_peak)
        anon_peak = rss[0];
    rtk_out_put(&o, "%s\"process_rss_anon_bytes\": %lld,%s\"process_rss_anon_peak_sampled_bytes\": %lld,"
            "%s\"process_rss_file_bytes\": %lld,%s\"process_rss_shmem_bytes\": %lld,",
        nl, rss[0], nl, anon_peak, nl, rss[1], nl, rss[2]);
    /* the tier view: pool pages in DRAM (mincore), the largest records, and residency over time */
    rtk_out_put(&o, "%s\"pool_resident_bytes\": %llu,%s\"pmem_resident_max\": %llu,%s\"budget_passes\": %llu,"
            "%s\"budget_dropped_bytes\": %llu,%s\"records_live\": %u,%s\"records\": [", nl, U(g_resident), nl,
        U(T.resident_max), nl, U(g_evictions), nl, U(g_evicted_bytes), nl, g_nlive, nl);
    live_t *top = g_top;
    /* the records and the timeline go to pmem-<pid>.json only (indent), not into the allocator's copy */
    int ntop = indent ? g_ntop : 0;
    for (int i = 0; i < ntop; i++)
        rtk_out_put(&o, "%s{\"offset\": %llu, \"bytes\": %llu, \"resident_bytes\": %llu, \"dram_head_bytes\": %llu, "
                "\"hot_fraction\": %.4f}",
            i ? ", " : "", U(top[i].payload - T.base), U(top[i].n), U(top[i].resident + top[i].head_resident),
            U(top[i].head), hot_fraction(&top[i]));
    rtk_out_put(&o, "],%s\"timeline\": [", nl);
    unsigned first_tl = g_ntl > TL_CAP ? g_ntl - TL_CAP : 0;
    for (unsigned i = first_tl; indent && i < g_ntl; i++) {
        tl_t *x = &g_tl[i % TL_CAP];
        rtk_out_put(&o, "%s{\"step\": %llu, \"t_s\": %.3f, \"resident_bytes\": %llu, \"tier_bytes\": %llu, "
                "\"major_faults\": %llu}", i > first_tl ? ", " : "", U(x->step), x->t_s, U(x->resident),
            U(x->tier_bytes), U(x->major_faults));
    }
    rtk_out_put(&o, "],");
    rtk_out_put(&o, "%s\"pool\": ", nl);
    if (T.pool && st == T_ON) {  /* not in a forked child: a pool lock may be held by a thread it lost */
        rtkit_pmem_stats s;
        rtkit_pmem_stats_get(T.pool, &s);
        rtk_out_put(&o, "{\"pmem_segment_size\": %llu, \"pmem_block_size\": %u, \"pmem_max_record\": %u, "
                "\"segments\": %u, \"segments_free\": %llu, \"segments_class\": %llu, \"segments_extent\": %llu, "
                "\"allocated_bytes\": %llu, \"requested_bytes\": %llu, \"extents\": %llu, \"extent_bytes\": %llu, "
                "\"fragmentation\": %.4f, \"is_pmem\": %s, \"persist\": \"%s\", \"background_runs\": %llu, "
                "\"background_moves\": %llu, \"moved_records\": %llu, \"classes\": [",
            U(s.segment_size), s.block_size, s.max_record, s.nsegments, U(s.segments_free), U(s.segments_class),
            U(s.segments_extent), U(s.allocated_bytes), U(s.requested_bytes), U(s.extents), U(s.extent_bytes),
            s.fragmentation, s.is_pmem ? "true" : "false",
            s.persist_kind == RTKIT_PMEM_PERSIST_FLUSH ? "flush" : s.persist_kind == RTKIT_PMEM_PERSIST_MSYNC ? "msync"
                                                                                                            : "none",
            U(s.background_runs), U(s.background_moves), U(s.moved_records));
        int seen = 0, first = 1;
        for (uint32_t c = 1; c < 65536; c++) {
            rtkit_pmem_class_stats cs;
            if (rtkit_pmem_class_stats_get(T.pool, c, &cs) != 0) {
                if (seen)
                    break;
                continue;
            }
            seen = 1;
            if (cs.allocated <= 0 && !cs.segments)
                continue;
            rtk_out_put(&o, "%s{\"record_size_bytes\": %u, \"allocated\": %lld, \"segments\": %u}", first ? "" : ", ",
                cs.record_size, (long long)cs.allocated, cs.segments);
            first = 0;
        }
        rtk_out_put(&o, "]}");
        rtk_out_put(&o, ",%s\"background_moves\": %llu", nl, U(s.background_moves));
    } else {
        rtk_out_put(&o, "null,%s\"background_moves\": 0", nl);
    }
    rtk_out_put(&o, ",%s\"notes\": [", nl);
    int n = 0;
    if (T.reason[0]) {
        rtk_out_str(&o, T.reason);
        n++;
    }
    for (int i = 0; i < T.nerrors; i++, n++) {
        rtk_out_put(&o, n ? ", " : "");
        rtk_out_str(&o, T.errors[i]);
    }
    if (st == T_ON && strcmp(T.medium, "tmpfs") == 0)
        rtk_out_put(&o, "%s\"pool on tmpfs: its pages are shared memory, still RAM; DRAM saved counts anonymous memory only\"",
            n++ ? ", " : "");
    if (st == T_IDLE)
        rtk_out_put(&o, "%s\"no allocation qualified yet: the pool is created at the first one\"", n++ ? ", " : "");
    rtk_out_put(&o, "]%s}", indent ? "\n" : " ");
    return o.full ? -1 : (long)o.off;
}

static char g_tbuf[262144];

void rtk_tier_write_file(const char *run_dir, long pid)
{
    if (T.state == T_OFF || !run_dir || !run_dir[0])
        return;
    sample_residency(g_exiting);
    long n = rtk_tier_format(g_tbuf, sizeof g_tbuf - 1, 1);
    if (n < 0)
        return;
    g_tbuf[n++] = '\n';
    char path[1200];
    snprintf(path, sizeof path, "%s/pmem-%ld.json", run_dir, pid);
    rtk_os_write_file_atomic(path, g_tbuf, (size_t)n);
}
