/* interpose.c -- the interposed entry points: the C allocation API and every C++ operator new/delete form.
 * Small requests take an inline path (census in the thread's slot + glibc); the rest goes to alloc.c.
 * With -DRTK_NO_INTERPOSE (unit tests) the same functions are built as rtk_api_* instead. */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/os.h"
#include "prmalloc/alloc.h"
#include "prmalloc/arena_slots.h"
#include "prmalloc/glibc_heap.h"
#include "prmalloc/large.h"
#include "prmalloc/heap_usage.h"
#include "prmalloc/init.h"
#include "prmalloc/owner.h"
#include "prmalloc/profile.h"
#include "prmalloc/fallback_stash.h"

#ifdef RTK_NO_INTERPOSE
#define API(name) rtk_api_##name
#define EXPORT __attribute__((visibility("hidden")))
#else
#define API(name) name
#define EXPORT __attribute__((visibility("default")))
#endif

/* the two census adds per bucket must stay two scalar adds: GCC's SLP vectorizer turns them into
 * SSE shuffles that cost more instructions than they save on this path */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-slp-vectorize")
#endif

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

static inline int is_pow2(size_t a) { return a && !(a & (a - 1)); }

/* m = max(n, 9) serves both: glibc's 32-byte minimum chunk without a second compare, and a nonzero bucket
 * argument (bsr without the |1). So requests of 0..8 bytes are counted in the 8..15 B class (bytes stay exact):
 * they take the same 32-byte chunk as 9..15 B requests anyway. k: the weight of this record (sampling). */
static inline void census_small(rtk_tslot_t *s, size_t n)
{
    size_t m = n < 9 ? 9 : n;
    unsigned b = 63u - (unsigned)__builtin_clzl(m);
    s->count[b]++;
    s->bytes[b] += n;
}

/* The small-object census is sampled by bytes, as heap profilers sample: each thread holds a byte budget;
 * every malloc spends its size, and the one that overdraws it takes the slow path, which records it with
 * the weight of the bytes it stands for and refills the budget. The budget never exceeds fast_max, so a
 * request at or above fast_max always overdraws it and reaches rtk_alloc. The fast path is a thread-local
 * subtraction and a tail call to glibc. (Counts per size class are estimates; bytes are exact to one budget.) */
static __thread size_t t_budget __attribute__((tls_model("initial-exec"), used));

/* 1 when n overdraws the thread's budget (unsigned borrow: exact for every n, even SIZE_MAX) */
static inline int budget_overdrawn(size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(RTK_NO_INTERPOSE)
    /* one memory-destination subtract on %fs (GCC emits load, subtract, store for the C form) */
    __asm__ goto("movq t_budget@gottpoff(%%rip), %%rax\n\t"
                 "subq %0, %%fs:(%%rax)\n\t"
                 "jb %l[over]"
                 : : "r"(n) : "rax", "cc", "memory" : over);
    return 0;
over:
    return 1;
#else
    return __builtin_sub_overflow(t_budget, n, &t_budget);
#endif
}

__attribute__((noinline)) static void *malloc_slow(size_t n)
{
    size_t refill = rtk_fastpath.sample_bytes;
    if (n < rtk_fastpath.fast_max) {
        if (rtk_fastpath.inspect && rtk_setting_on(RTK_OPT_MALLOC_CENSUS)) {
            /* this malloc overdrew the budget: it stands for `refill` bytes of small requests */
            rtk_tslot_t *s = rtk_slot();
            size_t m = n < 9 ? 9 : n;
            unsigned b = 63u - (unsigned)__builtin_clzl(m);
            size_t w = n >= refill ? 1 : refill / m;
            s->count[b] += w;
            s->bytes[b] += n >= refill ? n : refill;
        }
        t_budget = refill;
        void *p = __libc_malloc(n);
        rtk_glibc_heap_seen(p);  /* a sample of the heaps glibc grows: each gets huge pages once */
        return p;
    }
    t_budget = refill;  /* a large request spends nothing of the sampling budget */
    if (n < rtk_fastpath.pass_max)  /* RTKIT_MALLOC_CENSUS=0 or not initialised yet: nothing counted */
        return __libc_malloc(n);
    return rtk_alloc(n, 0, 0);
}

EXPORT void *API(malloc)(size_t n)
{
    if (unlikely(budget_overdrawn(n)))
        return malloc_slow(n);
    return __libc_malloc(n);
}

__attribute__((noinline)) static void free_slow(void *p, size_t cs)
{
    rtk_tslot_t *s = rtk_slot();
    s->frees++;
    s->live -= (int64_t)cs;
    if (cs >= rtk_fastpath.track_min) {  /* profiling, or planned: a fallback block the stash may keep */
        rtk_profile_free(p);
        int kept = rtk_stash_push(p, cs);
        if (kept > 0)
            return;
        if (kept < 0)
            rtk_heap_corrupt("free()", "double free of", p);
    }
    __libc_free(p);
}

/* p lies in the range covering rtkit's memory (or every pointer, while large glibc frees must be watched:
 * profiling, fallback stash): which one, if any */
__attribute__((noinline)) static void free_special(void *p)
{
    if (p == NULL)
        return;
    rtk_owner_t o = rtk_owner_of(p);
    if (o.kind != RTK_OWNER_GLIBC) {
        rtk_free_owned(p, &o);
        return;
    }
    free_slow(p, rtk_chunk_bytes(p));
}

/* Small frees are not counted: live bytes come from glibc's own books at each step mark (census.c), so a free
 * of glibc's memory is one range test and a tail call. */
EXPORT void API(free)(void *p)
{
    /* one range covers all of rtkit's memory (empty while there is none; NULL is never inside). Low first: glibc's
     * main heap lies below every mapping, so most frees leave after one compare */
    if (unlikely((uintptr_t)p >= rtk_fastpath.any_lo) && unlikely((uintptr_t)p < rtk_fastpath.any_hi))
        return free_special(p);
    __libc_free(p);
}

EXPORT void *API(calloc)(size_t nmemb, size_t size)
{
    size_t n;
    if (unlikely(__builtin_mul_overflow(nmemb, size, &n))) {
        errno = ENOMEM;
        return NULL;
    }
    if (likely(n < rtk_fastpath.fast_max)) {
        if (rtk_fastpath.inspect) {
            rtk_tslot_t *s = rtk_slot();
            census_small(s, n);
            s->calloc_calls++;
        }
        return __libc_calloc(1, n);
    }
    void *p = rtk_alloc(n, 0, 1);
    if (rtk_fastpath.inspect)
        rtk_slot()->calloc_calls++;
    return p;
}

EXPORT void *API(realloc)(void *p, size_t n)
{
    if (p == NULL)
        return API(malloc)(n);
    if (n == 0) {  /* glibc frees and returns NULL */
        API(free)(p);
        return NULL;
    }
    return rtk_realloc(p, n);
}

EXPORT void *API(reallocarray)(void *p, size_t nmemb, size_t size)
{
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return API(realloc)(p, n);
}

static void *aligned(size_t align, size_t n)
{
    void *p = rtk_alloc(n, align, 0);
    if (rtk_fastpath.inspect)
        rtk_slot()->memalign_calls++;
    return p;
}

EXPORT int API(posix_memalign)(void **out, size_t align, size_t n)
{
    if (!is_pow2(align) || align % sizeof(void *))
        return EINVAL;
    int saved = errno;
    void *p = aligned(align, n);
    if (!p) {
        errno = ENOMEM;  /* as glibc's: its own tests (tst-malloc-thread-fail) read errno after a failed call */
        return ENOMEM;
    }
    errno = saved;
    *out = p;
    return 0;
}

EXPORT void *API(aligned_alloc)(size_t align, size_t n)
{
    if (!is_pow2(align)) {
        errno = EINVAL;
        return NULL;
    }
    return aligned(align, n);
}

EXPORT void *API(memalign)(size_t align, size_t n)
{
    if (align > ((size_t)1 << 63)) {  /* no power of two: glibc's EINVAL (2^63 itself is too large: ENOMEM) */
        errno = EINVAL;
        return NULL;
    }
    /* glibc rounds a non-power-of-two alignment up to the next power of two */
    if (!is_pow2(align))
        align = align ? (size_t)1 << (64 - __builtin_clzl(align)) : 1;
    return aligned(align, n);
}

static size_t page_size(void)
{
    static size_t page;
    if (!page)
        page = rtk_os_page_size();
    return page;
}

EXPORT void *API(valloc)(size_t n) { return aligned(page_size(), n); }

EXPORT void *API(pvalloc)(size_t n)
{
    size_t page = page_size(), r;
    if (__builtin_add_overflow(n, page - 1, &r)) {
        errno = ENOMEM;
        return NULL;
    }
    r &= ~(page - 1);
    return aligned(page, r ? r : page);
}

EXPORT size_t API(malloc_usable_size)(void *p) { return rtk_usable_size(p); }

/* ---- the rest of a complete malloc: old and new free forms, statistics and trimming that see rtkit's memory */
EXPORT void API(cfree)(void *p) { API(free)(p); }
EXPORT void API(free_sized)(void *p, size_t n) { (void)n; API(free)(p); }
EXPORT void API(free_aligned_sized)(void *p, size_t al, size_t n) { (void)al; (void)n; API(free)(p); }

extern int __libc_mallopt(int, int);
EXPORT int API(mallopt)(int param, int value) { return __libc_mallopt(param, value); }

/* glibc's own definition of a statistics call (dlsym may allocate: it comes back here, which is fine) */
static void *next_sym(void **cache, const char *name)
{
    void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, name);
        __atomic_store_n(cache, f, __ATOMIC_RELEASE);
    }
    return f;
}

EXPORT struct mallinfo2 API(mallinfo2)(void)
{
    static void *next;
    struct mallinfo2 (*f)(void) = (struct mallinfo2 (*)(void))next_sym(&next, "mallinfo2");
    struct mallinfo2 m;
    memset(&m, 0, sizeof m);
    if (f)
        m = f();
    size_t live, idle;
    rtk_rtkit_usage(&live, &idle);
    m.arena += live + idle;
    m.uordblks += live;
    m.fordblks += idle;
    return m;
}

static int clamp_int(size_t v) { return v > (size_t)0x7fffffff ? 0x7fffffff : (int)v; }

EXPORT struct mallinfo API(mallinfo)(void)
{
    struct mallinfo2 m2 = API(mallinfo2)();
    struct mallinfo m;
    m.arena = clamp_int(m2.arena);
    m.ordblks = clamp_int(m2.ordblks);
    m.smblks = clamp_int(m2.smblks);
    m.hblks = clamp_int(m2.hblks);
    m.hblkhd = clamp_int(m2.hblkhd);
    m.usmblks = clamp_int(m2.usmblks);
    m.fsmblks = clamp_int(m2.fsmblks);
    m.uordblks = clamp_int(m2.uordblks);
    m.fordblks = clamp_int(m2.fordblks);
    m.keepcost = clamp_int(m2.keepcost);
    return m;
}

EXPORT int API(malloc_trim)(size_t pad)
{
    static void *next;
    int (*f)(size_t) = (int (*)(size_t))next_sym(&next, "malloc_trim");
    int r = f ? f(pad) : 0;
    size_t released = rtk_large_trim() + rtk_arenas_trim();
    return r || released > 0;
}

/* glibc's XML document with one <rtkit .../> element before its closing tag */
EXPORT int API(malloc_info)(int options, FILE *fp)
{
    static void *next;
    int (*f)(int, FILE *) = (int (*)(int, FILE *))next_sym(&next, "malloc_info");
    if (options != 0 || !fp) {
        errno = EINVAL;
        return -1;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    int r = -1;
    if (mem && f) {
        r = f(options, mem);
        fclose(mem);
    } else if (mem) {
        fclose(mem);
    }
    size_t live, idle;
    rtk_rtkit_usage(&live, &idle);
    rtk_large_info_t li;
    rtk_large_info(&li);
    const char *end = buf ? strstr(buf, "</malloc>") : NULL;
    size_t head = end ? (size_t)(end - buf) : (buf ? len : 0);
    if (buf)
        fwrite(buf, 1, head, fp);
    fprintf(fp, "<rtkit live=\"%zu\" idle=\"%zu\" large_reserved=\"%zu\" large_used=\"%zu\" large_released=\"%zu\"/>\n",
            live, idle, li.reserved, li.used, li.released);
    if (end)
        fputs(end, fp);
    else if (!buf)
        fputs("</malloc>\n", fp);
    free(buf);
    return r < 0 && !buf ? -1 : 0;
}

#ifndef RTK_NO_INTERPOSE
/* ---- C++ operators, by their Itanium-ABI names (size_t = unsigned long: 'm').
 * A throwing form that gets NULL hands the request to the next definition (libstdc++'s), which calls our
 * malloc again and, on failure, runs the new-handler loop and throws std::bad_alloc as C++ requires. */
typedef void *(*new_fn)(size_t);
typedef void *(*new_al_fn)(size_t, size_t);

__attribute__((noinline, cold)) static void *new_failed(const char *sym, size_t n)
{
    new_fn next = (new_fn)dlsym(RTLD_NEXT, sym);
    if (next)
        return next(n);
    rtk_log_line("operator new(%zu) failed and no C++ runtime provides bad_alloc; aborting", n);
    abort();
}

__attribute__((noinline, cold)) static void *new_al_failed(const char *sym, size_t n, size_t al)
{
    new_al_fn next = (new_al_fn)dlsym(RTLD_NEXT, sym);
    if (next)
        return next(n, al);
    rtk_log_line("aligned operator new(%zu, %zu) failed and no C++ runtime provides bad_alloc; aborting", n, al);
    abort();
}

static inline void *new_aligned(size_t n, size_t al)
{
    if (al <= 16)
        return malloc(n);
    return aligned(al, n);
}

EXPORT void *_Znwm(size_t n) { void *p = malloc(n); return likely(p != NULL) ? p : new_failed("_Znwm", n); }
EXPORT void *_Znam(size_t n) { void *p = malloc(n); return likely(p != NULL) ? p : new_failed("_Znam", n); }
/* nothrow forms that get NULL hand over to libstdc++'s: it runs the new-handler loop (which may free memory
 * and retry through our malloc) and turns bad_alloc into nullptr, as the C++ standard requires */
typedef void *(*new_nt_fn)(size_t, const void *);
typedef void *(*new_al_nt_fn)(size_t, size_t, const void *);

__attribute__((noinline, cold)) static void *new_nt_failed(const char *sym, size_t n, const void *nt)
{
    new_nt_fn next = (new_nt_fn)dlsym(RTLD_NEXT, sym);
    return next ? next(n, nt) : NULL;
}

__attribute__((noinline, cold)) static void *new_al_nt_failed(const char *sym, size_t n, size_t al, const void *nt)
{
    new_al_nt_fn next = (new_al_nt_fn)dlsym(RTLD_NEXT, sym);
    return next ? next(n, al, nt) : NULL;
}

EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const void *nt)
{
    void *p = malloc(n);
    return likely(p != NULL) ? p : new_nt_failed("_ZnwmRKSt9nothrow_t", n, nt);
}
EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const void *nt)
{
    void *p = malloc(n);
    return likely(p != NULL) ? p : new_nt_failed("_ZnamRKSt9nothrow_t", n, nt);
}
EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t al)
{
    void *p = new_aligned(n, al);
    return likely(p != NULL) ? p : new_al_failed("_ZnwmSt11align_val_t", n, al);
}
EXPORT void *_ZnamSt11align_val_t(size_t n, size_t al)
{
    void *p = new_aligned(n, al);
    return likely(p != NULL) ? p : new_al_failed("_ZnamSt11align_val_t", n, al);
}
EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt)
{
    void *p = new_aligned(n, al);
    return likely(p != NULL) ? p : new_al_nt_failed("_ZnwmSt11align_val_tRKSt9nothrow_t", n, al, nt);
}
EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt)
{
    void *p = new_aligned(n, al);
    return likely(p != NULL) ? p : new_al_nt_failed("_ZnamSt11align_val_tRKSt9nothrow_t", n, al, nt);
}

EXPORT void _ZdlPv(void *p) { free(p); }
EXPORT void _ZdaPv(void *p) { free(p); }
EXPORT void _ZdlPvm(void *p, size_t n) { (void)n; free(p); }
EXPORT void _ZdaPvm(void *p, size_t n) { (void)n; free(p); }
EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const void *nt) { (void)nt; free(p); }
EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const void *nt) { (void)nt; free(p); }
EXPORT void _ZdlPvSt11align_val_t(void *p, size_t al) { (void)al; free(p); }
EXPORT void _ZdaPvSt11align_val_t(void *p, size_t al) { (void)al; free(p); }
EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t al) { (void)n; (void)al; free(p); }
EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t al) { (void)n; (void)al; free(p); }
EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) { (void)al; (void)nt; free(p); }
EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) { (void)al; (void)nt; free(p); }
#endif
