/* prmalloc_unit_plan.c -- unit tests of the planner, plan file, arenas and env parsing, linked against the
 * sources (-DRTK_NO_INTERPOSE): lifetime packing, spacing choice, trimming, round trip, rejection, borrowing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/options.h"
#include "prmalloc/internal.h"
#include "prmalloc/owner.h"
#include "prmalloc/planfile.h"

static int g_failures;
#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
                                         g_failures++; } } while (0)

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static rtk_event_t ev[4096];
static size_t nev;
static void A(size_t size) { ev[nev++] = (rtk_event_t){size, 0, 1}; }
static void F(size_t size) { ev[nev++] = (rtk_event_t){size, 0, 2}; }

static uint32_t blocks_of(const rtk_plan_t *p, size_t size)
{
    for (int i = 0; i < p->nclasses; i++)
        if (p->cls[i].size == size)
            return p->cls[i].blocks;
    return 0;
}

static void test_class_round(void)
{
    CHECK(rtk_class_round(1, 0) == 64);
    CHECK(rtk_class_round(100, 0) == 128);
    CHECK(rtk_class_round(MiB, 0) == MiB);
    CHECK(rtk_class_round(MiB + 1, 0) == MiB + 64);
    CHECK(rtk_class_round(MiB + 1, 1) == MiB + MiB / 8);  /* 1/8 octave */
    CHECK(rtk_class_round(MiB + 1, 2) == MiB + MiB / 4);
    CHECK(rtk_class_round(MiB + 1, 3) == MiB + MiB / 2);
    CHECK(rtk_class_round(MiB + 1, 4) == 2 * MiB);
    CHECK(rtk_class_round(MiB, 4) == MiB);
}

static void test_lifetime_packing(void)
{
    rtk_planner_t pl;
    rtk_plan_t p;
    rtk_planner_reset(&pl);
    /* sequential lifetimes share one block; two overlapping ones need two */
    nev = 0;
    A(MiB); F(MiB); A(MiB); F(MiB);
    A(2 * MiB); A(2 * MiB); F(2 * MiB); F(2 * MiB);
    rtk_planner_add_step(&pl, ev, nev);
    CHECK(rtk_planner_plan(&pl, 0, 4096, &p) == 0);
    CHECK(p.nclasses == 2);
    CHECK(blocks_of(&p, MiB) == 1);
    CHECK(blocks_of(&p, 2 * MiB) == 2);
    CHECK(p.reserved == MiB + 4 * MiB);
    /* the 1 MiB and 2 MiB blocks are never live together: the step needs 4 MiB at once, not the classes' 5 */
    CHECK(p.step_peak == 4 * MiB);
    /* a later step with 3 overlapping 1 MiB: the plan keeps the maximum over steps */
    nev = 0;
    A(MiB); A(MiB); A(MiB); F(MiB); F(MiB); F(MiB);
    rtk_planner_add_step(&pl, ev, nev);
    rtk_planner_plan(&pl, 0, 4096, &p);
    CHECK(blocks_of(&p, MiB) == 3 && blocks_of(&p, 2 * MiB) == 2);
    CHECK(p.step_peak == 4 * MiB && p.reserved == 3 * MiB + 4 * MiB);
    /* frees of sizes never allocated in the step (carried elsewhere) do not underflow */
    nev = 0;
    F(5 * MiB); A(MiB); F(MiB);
    rtk_planner_add_step(&pl, ev, nev);
    rtk_planner_plan(&pl, 0, 4096, &p);
    CHECK(blocks_of(&p, 5 * MiB) == 0 && p.nclasses == 2);
}

/* sizes above class_max get no class: counted, left to the large heap; a plan of only such sizes has no class */
static void test_class_max(void)
{
    rtk_planner_t pl;
    rtk_plan_t p;
    rtk_planner_reset(&pl);
    pl.class_max = 2 * MiB;
    nev = 0;
    A(MiB); F(MiB); A(2 * MiB); F(2 * MiB); A(3 * MiB); F(3 * MiB); A(8 * MiB); F(8 * MiB);
    rtk_planner_add_step(&pl, ev, nev);
    CHECK(rtk_planner_plan(&pl, 0, 4096, &p) == 0);
    CHECK(p.nclasses == 2 && blocks_of(&p, MiB) == 1 && blocks_of(&p, 2 * MiB) == 1);
    CHECK(p.above_max == 2 && p.reserved == 3 * MiB && p.step_peak == 8 * MiB);
    CHECK(rtk_planner_best(&pl, 4096, &p) >= 0 && p.nclasses >= 1 && p.above_max >= 2);
    rtk_planner_reset(&pl);
    pl.class_max = MiB / 2;
    rtk_planner_add_step(&pl, ev, nev);
    CHECK(rtk_planner_best(&pl, 4096, &p) < 0 && p.nclasses == 0 && p.above_max == 4);
    pl.class_max = 0;  /* no bound: every size planned, as before the bound */
    CHECK(rtk_planner_best(&pl, 4096, &p) >= 0 && p.above_max == 0);
    CHECK(rtk_planner_plan(&pl, 0, 4096, &p) == 0 && p.nclasses == 4);
}

static void test_spacing_choice(void)
{
    rtk_planner_t pl;
    rtk_plan_t p;
    /* fixed sizes: exact spacing wastes nothing and wins */
    rtk_planner_reset(&pl);
    for (int s = 0; s < 3; s++) {
        nev = 0;
        A(3 * MiB + 4096); A(700 * KiB); F(700 * KiB); F(3 * MiB + 4096);
        rtk_planner_add_step(&pl, ev, nev);
    }
    CHECK(rtk_planner_best(&pl, 4096, &p) == 0);
    CHECK(p.nclasses == 2 && p.reserved == 3 * MiB + 4096 + 700 * KiB);
    /* sizes varying with the batch (+-3% per step): exact needs a block per size seen; a coarser grid wins */
    rtk_planner_reset(&pl);
    for (int s = 0; s < 10; s++) {
        size_t v = 4 * MiB + (size_t)s * 37 * 4096;
        nev = 0;
        A(v); A(v / 2); F(v / 2); F(v);
        rtk_planner_add_step(&pl, ev, nev);
    }
    int sp = rtk_planner_best(&pl, 4096, &p);
    CHECK(sp > 0);
    CHECK(p.nclasses <= 4);
    rtk_plan_t exact;
    rtk_planner_plan(&pl, 0, 4096, &exact);
    CHECK(exact.reserved > p.reserved);
    /* more than RTK_MAX_CLASSES distinct exact sizes: exact is unusable, others still plan */
    rtk_planner_reset(&pl);
    nev = 0;
    for (int i = 0; i < 300; i++) {
        A(64 * KiB + (size_t)i * 640);
        F(64 * KiB + (size_t)i * 640);
    }
    rtk_planner_add_step(&pl, ev, nev);
    CHECK(rtk_planner_plan(&pl, 0, 4096, &p) == -1);
    CHECK(rtk_planner_best(&pl, 4096, &p) > 0 && p.nclasses > 0);
}

static void test_trim_and_file(void)
{
    rtk_plan_t p = {0}, q;
    p.nclasses = 3;
    p.cls[0] = (rtk_class_t){64 * KiB, 4, 4096};
    p.cls[1] = (rtk_class_t){MiB, 2, 4096};
    p.cls[2] = (rtk_class_t){8 * MiB, 3, 4096};
    p.spacing = 1;
    p.step_peak = 5 * MiB;
    CHECK(rtk_plan_trim(&p, 64 * MiB, 4096) == 256 * KiB + 2 * MiB + 24 * MiB);
    CHECK(rtk_plan_trim(&p, 12 * MiB, 4096) <= 12 * MiB);
    CHECK(p.nclasses == 3 && p.cls[2].blocks == 1);
    char buf[8192], why[256];
    int n = rtk_plan_format(&p, 32 * KiB, buf, sizeof buf);
    CHECK(n > 0);
    CHECK(rtk_plan_parse(buf, &q, why, sizeof why) == 0);
    CHECK(rtk_plan_equal(&p, &q) && q.spacing == 1 && q.reserved == p.reserved && q.step_peak == 5 * MiB);
    /* an edited block count breaks the fingerprint */
    char *line = strstr(buf, "class 1048576 2 ");
    CHECK(line != NULL);
    if (line) {
        line[14] = '3';
        CHECK(rtk_plan_parse(buf, &q, why, sizeof why) == -1 && strstr(why, "fingerprint"));
    }
    CHECK(rtk_plan_parse("rtkit-malloc-plan 99\nend\n", &q, why, sizeof why) == -1 && strstr(why, "version"));
    CHECK(rtk_plan_parse("hello\n", &q, why, sizeof why) == -1);
    rtk_plan_format(&p, 32 * KiB, buf, sizeof buf);
    buf[strlen(buf) - 4] = 0;  /* drop "end\n" */
    CHECK(rtk_plan_parse(buf, &q, why, sizeof why) == -1 && strstr(why, "truncated"));
}

static void test_arena(void)
{
    rtk_plan_t p = {0};
    p.nclasses = 3;
    p.cls[0] = (rtk_class_t){64 * KiB, 2, 4096};
    p.cls[1] = (rtk_class_t){100 * KiB, 1, 4096};
    p.cls[2] = (rtk_class_t){MiB, 2, 4096};
    rtk_arena_t *a = rtk_arena_create(&p, 0, 1, 1, NULL);
    CHECK(a != NULL);
    if (!a)
        return;
    int why;
    size_t bs = 0;
    void *x = rtk_arena_alloc(a, 60 * KiB, 64, &why, &bs);
    void *y = rtk_arena_alloc(a, 64 * KiB, 64, &why, &bs);
    CHECK(x && y && x != y && why == RTK_ARENA_OK);
    /* class 64K exhausted: borrow 100K (<= 2x) */
    void *z = rtk_arena_alloc(a, 64 * KiB, 64, &why, &bs);
    CHECK(z && bs == 100 * KiB);
    /* every class that fits is exhausted: the 64K class grows, a block at a time, to twice its planned 2, by taking
     * the exhausted requests' own fallback blocks at their frees (nothing faulted in, no idle extent of the heap's) */
    size_t u;
    void *fb[3];
    for (int i = 0; i < 3; i++) {
        CHECK(!rtk_arena_alloc(a, 64 * KiB, 64, &why, &bs) && why == RTK_ARENA_EXHAUSTED);
        fb[i] = rtk_large_alloc(64 * KiB, 4096, &u);   /* the request's fallback, as malloc makes it */
        CHECK(fb[i] != NULL);
    }
    CHECK(a->cls[0].blocks == 2 && a->cls[0].wanted == 2);   /* two wanted: the cap is 4 */
    CHECK(rtk_arena_adopt(a, fb[0], 64 * KiB) == 1 && rtk_arena_adopt(a, fb[1], 64 * KiB) == 1);
    CHECK(rtk_arena_adopt(a, fb[2], 64 * KiB) == 0 && rtk_large_free(fb[2], &bs) == 0);   /* at its cap */
    CHECK(a->cls[0].blocks == 4 && a->cls[0].grown == 2 && a->cls[0].wanted == 0 && a->cls[0].adopted == 0);
    void *g0 = rtk_arena_alloc(a, 64 * KiB, 64, &why, &bs), *g1 = rtk_arena_alloc(a, 64 * KiB, 64, &why, &bs);
    CHECK(g1 == fb[0] && g0 == fb[1] && why == RTK_ARENA_OK && bs == 64 * KiB);   /* LIFO */
    uint32_t gw;
    CHECK(rtk_large_block(g0, &bs, &gw) == RTK_BLOCK_LIVE && gw == (RTK_OWNER_WORD(0, 0) | RTK_OWNER_INUSE));
    CHECK(!rtk_arena_alloc(a, 64 * KiB, 64, &why, &bs) && why == RTK_ARENA_EXHAUSTED && a->cls[0].wanted == 0);
    CHECK(!rtk_arena_alloc(a, 60 * KiB, 64, &why, &bs) && a->cls[0].wanted == 0);   /* exact spacing: 60K's own
                                                                                        class is not 64K's */
    CHECK(rtk_arena_free(a, 0, g0) == 0 && rtk_arena_free(a, 0, g1) == 0);
    void *again = rtk_arena_alloc(a, 64 * KiB, 64, &why, &bs);   /* a grown block is the class's: back on its stack */
    CHECK(again == g1 && a->cls[0].blocks == 4);
    CHECK(rtk_arena_free(a, 0, again) == 0);
    CHECK(!rtk_arena_alloc(a, 3 * MiB, 64, &why, &bs) && why == RTK_ARENA_MISS);
    CHECK(!rtk_arena_alloc(a, 10 * KiB, 64, &why, &bs) && why == RTK_ARENA_MISS);  /* 64K > 2 x 10K */
    CHECK(!rtk_arena_alloc(a, MiB, 8192, &why, &bs));                             /* stricter than 4096 */
    uint32_t ow;
    CHECK(rtk_large_block(x, &bs, &ow) == RTK_BLOCK_LIVE && ow == (RTK_OWNER_WORD(0, 0) | RTK_OWNER_INUSE));
    CHECK(rtk_large_block(&why, &bs, &ow) == RTK_BLOCK_NONE && ow == 0);
    CHECK(rtk_arena_free(a, 0, (char *)x + 64) == -1);  /* not a block start */
    CHECK(rtk_arena_free(a, 1, x) == -1);                /* not a block of that class */
    CHECK(rtk_arena_free(a, 0, x) == 0);
    CHECK(rtk_arena_free(a, 0, x) == -2);                /* double free, in every mode */
    CHECK(rtk_arena_free(a, 0, y) == 0 && rtk_arena_free(a, 1, z) == 0);
    CHECK(a->live_blocks == 0);
    void *m1 = rtk_arena_alloc(a, MiB, 4096, &why, &bs), *m2 = rtk_arena_alloc(a, MiB - 5, 64, &why, &bs);
    CHECK(m1 && m2 && ((uintptr_t)m1 & 4095) == 0 && ((uintptr_t)m2 & 4095) == 0);
    memset(m1, 1, MiB);
    memset(m2, 2, MiB);
    rtk_arena_free(a, 2, m1);
    rtk_arena_free(a, 2, m2);
}

/* Blocks of a class's size still live in the large heap when the plan is installed are not doubled with fresh
 * pages: the class takes them as they are freed, and only what none will cover is taken now. */
static void test_arena_adopts_live_blocks(void)
{
    size_t sz = 196 * KiB, u, bs;
    void *live[3];
    for (int i = 0; i < 3; i++)
        live[i] = rtk_large_alloc(sz, 4096, &u);
    CHECK(live[0] && live[1] && live[2]);
    rtk_large_trim();  /* no resident idle pages: the class's first block must come from fresh ones */
    rtk_large_info_t before, after;
    rtk_large_info(&before);
    rtk_plan_t p = {0};
    p.nclasses = 1;
    p.cls[0] = (rtk_class_t){sz, 4, 4096};
    rtk_arena_t *a = rtk_arena_create(&p, 1, 0, 0, NULL);
    CHECK(a != NULL);
    if (!a)
        return;
    rtk_large_info(&after);
    CHECK(a->cls[0].made == 1 && a->cls[0].awaited == 3);
    CHECK(after.in_use - before.in_use == 196 * KiB);  /* one block's pages, not four */
    for (int i = 0; i < 3; i++)
        CHECK(rtk_arena_adopt(a, live[i], 196 * KiB) == 1);
    CHECK(a->cls[0].made == 4 && a->cls[0].adopted == 3 && a->cls[0].awaited == 0);
    uint32_t ow;
    CHECK(rtk_large_block(live[0], &bs, &ow) == RTK_BLOCK_LIVE && ow == RTK_OWNER_WORD(1, 0));
    CHECK(rtk_large_free(live[0], &bs) == -2);  /* a free racing the adoption: the class holds it, a double free */
    void *extra = rtk_large_alloc(sz, 4096, &u);
    CHECK(extra && rtk_arena_adopt(a, extra, 196 * KiB) == 0);  /* the class is full: the large heap's again */
    CHECK(rtk_arena_adopt(a, extra, 100 * KiB) == 0);           /* no class of that size */
    CHECK(rtk_large_free(extra, &bs) == 0);
    int why;
    void *got[4];
    for (int i = 0; i < 4; i++)
        got[i] = rtk_arena_alloc(a, sz, 64, &why, &bs);
    CHECK(got[0] && got[1] && got[2] && got[3] && why == RTK_ARENA_OK);
    CHECK(!rtk_arena_alloc(a, sz, 64, &why, &bs) && why == RTK_ARENA_EXHAUSTED && a->cls[0].wanted == 1);
    for (int i = 0; i < 4; i++)
        CHECK(rtk_arena_free(a, 0, got[i]) == 0);
    a->retired = 1;
    uint64_t held = a->cls[0].made;
    void *late = rtk_large_alloc(sz, 4096, &u);
    CHECK(late && rtk_arena_adopt(a, late, 196 * KiB) == 0 && a->cls[0].made == held);  /* a retired arena adopts nothing */
    CHECK(rtk_large_free(late, &bs) == 0);
}

/* A bad setting's message goes to stderr: caught in a file while the readers are checked (a failed check's own line
 * is passed on to the real stderr) */
static FILE *g_err;
static int g_stderr = -1;

static void stderr_to_file(void)
{
    fflush(stderr);
    g_err = tmpfile();
    g_stderr = dup(2);
    dup2(fileno(g_err), 2);
}

/* what reached stderr since the last call */
static const char *said(void)
{
    static char buf[2048];
    fflush(stderr);
    ssize_t n = pread(fileno(g_err), buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    if (ftruncate(fileno(g_err), 0) != 0 || lseek(fileno(g_err), 0, SEEK_SET) != 0)
        abort();
    for (const char *f = strstr(buf, "FAIL "); f; f = strstr(f + 1, "FAIL "))
        if (write(g_stderr, f, strcspn(f, "\n") + 1) < 0)
            break;
    return buf;
}

static void stderr_back(void)
{
    said();
    dup2(g_stderr, 2);
    close(g_stderr);
    fclose(g_err);
}

static void test_env(void)
{
    size_t s;
    int b;
    long v;
    CHECK(rtk_parse_size("4096", &s) == 0 && s == 4096);
    CHECK(rtk_parse_size(" 64K ", &s) == 0 && s == 64 * KiB);
    CHECK(rtk_parse_size("2G", &s) == 0 && s == (size_t)2 << 30);
    CHECK(rtk_parse_size("1MiB", &s) == 0 && s == MiB);
    CHECK(rtk_parse_size("3mb", &s) == 0 && s == 3 * MiB);
    CHECK(rtk_parse_size("1.5M", &s) == -1);
    CHECK(rtk_parse_size("-1", &s) == -1);
    CHECK(rtk_parse_size("", &s) == -1);
    CHECK(rtk_parse_size("99999999999999999999", &s) == -1);
    CHECK(rtk_parse_size("99999999999T", &s) == -1);
    CHECK(rtk_parse_bool("On", &b) == 0 && b == 1);
    CHECK(rtk_parse_bool("0", &b) == 0 && b == 0);
    CHECK(rtk_parse_bool("maybe", &b) == -1);
    CHECK(rtk_parse_int(" -12 ", &v) == 0 && v == -12);
    CHECK(rtk_parse_int("12x", &v) == -1);
    /* the readers take names, defaults and limits from the generated table */
    const rtk_setting_t *ms = &rtk_settings[RTK_OPT_MALLOC_MIN_SIZE], *rb = &rtk_settings[RTK_OPT_PMEM_REBALANCE_MS];
    stderr_to_file();
    setenv(ms->env, "12Q", 1);
    CHECK(rtk_opt_size(RTK_OPT_MALLOC_MIN_SIZE, &s) == -1 && s == (size_t)ms->dflt);
    const char *line = said();
    CHECK(strstr(line, "MIN_SIZE='12Q'") && strstr(line, "a size such as") && strstr(line, "using the default"));
    CHECK(strchr(line, '\n') == line + strlen(line) - 1);  /* one line */
    unsetenv(ms->env);
    CHECK(rtk_opt_size(RTK_OPT_MALLOC_MIN_SIZE, &s) == 0 && s == (size_t)ms->dflt && !*said());
    setenv(rb->env, "0", 1);
    CHECK(rtk_opt_int(RTK_OPT_PMEM_REBALANCE_MS, &v) == -1 && v == rb->dflt && strstr(said(), ">= 1"));
    setenv(rb->env, "3600001", 1);
    CHECK(rtk_opt_int(RTK_OPT_PMEM_REBALANCE_MS, &v) == -1 && v == rb->dflt && strstr(said(), "<= 3600000"));
    setenv(rb->env, "3600000", 1);
    CHECK(rtk_opt_int(RTK_OPT_PMEM_REBALANCE_MS, &v) == 0 && v == 3600000);
    unsetenv(rb->env);
    /* a boolean is parsed, not tested for presence: =0 is off */
    const rtk_setting_t *mb = &rtk_settings[RTK_OPT_PMEM_MEMBARRIER];
    setenv(mb->env, "0", 1);
    CHECK(rtk_opt_bool(RTK_OPT_PMEM_MEMBARRIER, &b) == 0 && b == 0);
    setenv(mb->env, "on", 1);
    CHECK(rtk_opt_bool(RTK_OPT_PMEM_MEMBARRIER, &b) == 0 && b == 1);
    unsetenv(mb->env);
    /* the old name, whose value meant the opposite, is read where the new one is unset */
    setenv(mb->alias_env, "1", 1);
    CHECK(rtk_opt_bool(RTK_OPT_PMEM_MEMBARRIER, &b) == 0 && b == 0);
    setenv(mb->env, "1", 1);  /* the new name wins */
    CHECK(rtk_opt_bool(RTK_OPT_PMEM_MEMBARRIER, &b) == 0 && b == 1);
    unsetenv(mb->env);
    unsetenv(mb->alias_env);
    CHECK(!*said());
    stderr_back();
}

int main(void)
{
    test_class_round();
    test_lifetime_packing();
    test_class_max();
    test_spacing_choice();
    test_trim_and_file();
    test_arena();
    test_arena_adopts_live_blocks();
    test_env();
    if (g_failures) {
        fprintf(stderr, "prmalloc_unit_plan: %d check(s) failed\n", g_failures);
        return 1;
    }
    printf("prmalloc_unit_plan: ok\n");
    return 0;
}
