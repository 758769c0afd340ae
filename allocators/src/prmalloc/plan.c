/* plan.c -- turns profiled steps into an arena plan (lifetime packing per size class, several spacings) and fits a
 * plan into a byte limit. Pure functions over caller-owned memory: no allocation, unit-testable. */
#include <string.h>

#include "prmalloc/internal.h"

const char *const rtk_spacing_name[RTK_SPACINGS] = {"exact", "1/8", "1/4", "1/2", "1/1"};
static const unsigned steps_per_octave[RTK_SPACINGS] = {0, 8, 4, 2, 1};

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

#define PEAK_PAGE 4096  /* the plan file's page too (planfile.c): plans compare alike on every machine */

size_t rtk_class_round(size_t size, int spacing)
{
    if (size <= RTK_MIN_BLOCK_ALIGN)
        return RTK_MIN_BLOCK_ALIGN;
    unsigned s = steps_per_octave[spacing];
    size_t c = size;
    if (s) {
        unsigned k = 63u - (unsigned)__builtin_clzl(size);
        size_t base = (size_t)1 << k;
        size_t step = base / s;
        if (size != base)
            c = base + (size - base + step - 1) / step * step;
    }
    return round_up(c, RTK_MIN_BLOCK_ALIGN);
}

void rtk_planner_reset(rtk_planner_t *pl) { memset(pl, 0, sizeof *pl); }

static int ctab_find(rtk_ctab_t *t, size_t size, int add)
{
    for (int i = 0; i < t->n; i++)
        if (t->size[i] == size)
            return i;
    if (!add)
        return -1;
    if (t->n >= RTK_MAX_CLASSES) {
        t->overflow = 1;
        return -1;
    }
    int i = t->n++;
    t->size[i] = size;
    t->blocks[i] = 0;
    t->align[i] = 0;
    return i;
}

/* One profiled step: events in time order. Per class, the most blocks live at once is what lifetime packing
 * needs: blocks whose lifetimes do not overlap are reused (an interval graph needs max-overlap colours). */
void rtk_planner_add_step(rtk_planner_t *pl, const rtk_event_t *ev, size_t n)
{
    pl->steps++;
    /* the classes' sum of their own peaks exceeds this when sizes peak at different moments of the step (forward
     * and backward passes): the distance the report shows between the plan and what the step needs at once */
    size_t live = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = round_up(ev[i].size, PEAK_PAGE);
        if (ev[i].kind == 1 && (live += b) > pl->step_peak)
            pl->step_peak = live;
        else if (ev[i].kind != 1)
            live = live >= b ? live - b : 0;
    }
    for (int sp = 0; sp < RTK_SPACINGS; sp++) {
        rtk_ctab_t step;      /* blocks[] = most live this step */
        uint32_t live[RTK_MAX_CLASSES];
        step.n = 0;
        step.overflow = 0;
        memset(live, 0, sizeof live);
        for (size_t i = 0; i < n; i++) {
            int c = ctab_find(&step, rtk_class_round(ev[i].size, sp), ev[i].kind == 1);
            if (c < 0)
                continue;
            if (ev[i].kind == 1) {
                live[c]++;
                if (live[c] > step.blocks[c])
                    step.blocks[c] = live[c];
                if (ev[i].align > step.align[c])
                    step.align[c] = ev[i].align;
            } else if (live[c] > 0) {
                live[c]--;
            }
        }
        rtk_ctab_t *t = &pl->tab[sp];
        if (step.overflow)
            t->overflow = 1;
        for (int c = 0; c < step.n; c++) {
            int j = ctab_find(t, step.size[c], 1);
            if (j < 0)
                continue;
            if (step.blocks[c] > t->blocks[j])
                t->blocks[j] = step.blocks[c];
            if (step.align[c] > t->align[j])
                t->align[j] = step.align[c];
        }
    }
}

static size_t natural_align(size_t size)
{
    size_t a = size & (~size + 1);  /* lowest set bit; a page at most: larger only when a request asks for it */
    if (a > 4096)
        a = 4096;
    return a < RTK_MIN_BLOCK_ALIGN ? RTK_MIN_BLOCK_ALIGN : a;
}

/* what the arena takes: each block is a large-heap block of whole pages (a 64-byte class costs a page a block) */
size_t rtk_plan_reserved(const rtk_plan_t *p, size_t page)
{
    size_t r = 0;
    for (int i = 0; i < p->nclasses; i++)
        r += round_up(p->cls[i].size, page) * p->cls[i].blocks;
    return r;
}

static void plan_sort(rtk_plan_t *p)
{
    for (int i = 1; i < p->nclasses; i++) {
        rtk_class_t c = p->cls[i];
        int j = i - 1;
        while (j >= 0 && p->cls[j].size > c.size) {
            p->cls[j + 1] = p->cls[j];
            j--;
        }
        p->cls[j + 1] = c;
    }
}

int rtk_planner_plan(const rtk_planner_t *pl, int spacing, size_t page, rtk_plan_t *out)
{
    const rtk_ctab_t *t = &pl->tab[spacing];
    out->nclasses = 0;
    out->spacing = spacing;
    out->reserved = 0;
    out->above_max = 0;
    out->step_peak = pl->step_peak;
    if (t->overflow)
        return -1;
    for (int i = 0; i < t->n; i++) {
        if (!t->blocks[i])
            continue;
        size_t size = t->size[i];
        /* A class holds its own peak's blocks for the whole run; the large heap shares pages across sizes and keeps
         * them for reuse too, so a block this large gains little from a class (one call a block) but costs its size
         * whenever another size peaks (a two-tower model's 256 and 512 MiB in-batch score blocks: 1.33 GiB of
         * arenas for 825 MiB live at once, 2.31 GiB peak RSS against 1.79 GiB without the plan). */
        if (pl->class_max && size > pl->class_max) {
            out->above_max++;
            continue;
        }
        size_t want = t->align[i] > RTK_MAX_BLOCK_ALIGN ? RTK_MAX_BLOCK_ALIGN : t->align[i];
        if (want > natural_align(size))
            size = round_up(size, want);
        /* two spacings' classes may meet after alignment rounding: merge them */
        int merged = 0;
        for (int j = 0; j < out->nclasses; j++)
            if (out->cls[j].size == size) {
                out->cls[j].blocks += t->blocks[i];
                if (want > out->cls[j].align)
                    out->cls[j].align = (uint32_t)want;
                merged = 1;
            }
        if (merged)
            continue;
        rtk_class_t *c = &out->cls[out->nclasses++];
        c->size = size;
        c->blocks = t->blocks[i];
        c->align = (uint32_t)(want > natural_align(size) ? want : natural_align(size));
    }
    plan_sort(out);
    out->reserved = rtk_plan_reserved(out, page);
    return 0;
}

int rtk_planner_best(const rtk_planner_t *pl, size_t page, rtk_plan_t *out)
{
    rtk_plan_t cand;
    int best = -1;
    out->nclasses = 0;
    out->spacing = 0;
    out->reserved = 0;
    out->above_max = 0;
    for (int sp = 0; sp < RTK_SPACINGS; sp++) {
        if (rtk_planner_plan(pl, sp, page, &cand) != 0)
            continue;
        if (cand.nclasses == 0) {  /* every recurring size above class_max: say so when no spacing plans any */
            if (best < 0 && cand.above_max > out->above_max)
                out->above_max = cand.above_max;
            continue;
        }
        if (best < 0 || cand.reserved < out->reserved) {
            memcpy(out, &cand, sizeof cand);
            best = sp;
        }
    }
    return best;
}

int rtk_plan_equal(const rtk_plan_t *a, const rtk_plan_t *b)
{
    if (a->nclasses != b->nclasses)
        return 0;
    for (int i = 0; i < a->nclasses; i++)
        if (a->cls[i].size != b->cls[i].size || a->cls[i].blocks != b->cls[i].blocks)
            return 0;
    return 1;
}

/* Fit the plan into `limit` bytes: blocks of the largest classes go first (they cost most per block and the
 * glibc fallback handles big sizes with the least relative overhead). */
size_t rtk_plan_trim(rtk_plan_t *p, size_t limit, size_t page)
{
    p->reserved = rtk_plan_reserved(p, page);
    for (int i = p->nclasses - 1; i >= 0 && p->reserved > limit; i--) {
        while (p->cls[i].blocks > 0 && p->reserved > limit) {
            p->cls[i].blocks--;
            p->reserved = rtk_plan_reserved(p, page);
        }
    }
    int k = 0;
    for (int i = 0; i < p->nclasses; i++)
        if (p->cls[i].blocks)
            p->cls[k++] = p->cls[i];
    p->nclasses = k;
    p->reserved = rtk_plan_reserved(p, page);
    return p->reserved;
}
