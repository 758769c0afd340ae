/* arena_classes.c -- planned arenas: each class holds `blocks` blocks of the large-object heap, taken at install from the
 * heap's idle resident extents first (blocks of a class's size still live at the install are adopted as they are
 * freed; only blocks neither covers take other pages, faulted in then) and kept across steps on a spinlock free
 * stack: a plan adds no RSS for pages the heap already holds. A block's
 * owner word in the heap's page map names its arena, class and state (prmalloc/owner.h), so free finds the class in
 * O(1) without a header, and a double free or an interior pointer is caught in every mode. Dropped classes and retired arenas give their blocks (and the pages)
 * back to the heap. */
#include <string.h>

#include "common/os.h"
#include "prmalloc/arena_slots.h"
#include "prmalloc/internal.h"
#include "prmalloc/large.h"
#include "prmalloc/owner.h"

/* A class may grow to this many times its planned blocks: a profile of a few steps can see fewer blocks of a size
 * live at once than later steps keep (TensorFlow Recommenders' DCN: 23,462 requests found their class exhausted),
 * and each such request would go to the large heap at every step. Growth is one block at a time, on demand. */
#define GROW_FACTOR 2u
/* a retired class used within this many steps keeps its blocks' pages for the profile that follows */
#define WARM_STEPS 4u

static size_t page_round(size_t v)
{
    size_t page = rtk_os_page_size();
    return (v + page - 1) & ~(page - 1);
}

rtk_arena_t *rtk_arena_create(const rtk_plan_t *p, int slot, int thp, int debug, const char **why)
{
    static const char *no_why;
    (void)thp;  /* the blocks live in the large heap, advised (or not) as a whole */
    if (!why)
        why = &no_why;
    *why = "empty plan";
    if (p->nclasses <= 0)
        return NULL;
    _Static_assert(RTK_MAX_ARENAS <= 256 && RTK_MAX_CLASSES <= 256, "the owner word holds 8 bits of each");
    if (slot < 0 || slot >= RTK_MAX_ARENAS || p->nclasses > RTK_MAX_CLASSES) {
        *why = "too many plans in one process";
        return NULL;
    }
    /* the classes' blocks come from the large heap; a job that turned it off for its own large requests still
     * gets one for the arenas (RTKIT_MALLOC_LARGE=0 keeps those requests on glibc) */
    if (!rtk_large_span && rtk_large_init(RTK_LARGE_LIMIT, 0) != 0) {
        *why = "no address range could be reserved for it";
        return NULL;
    }
    size_t nblocks = 0, planned = 0;
    for (int i = 0; i < p->nclasses; i++) {
        nblocks += (size_t)p->cls[i].blocks * GROW_FACTOR;
        planned += page_round(p->cls[i].size) * p->cls[i].blocks;
    }
    /* a plan its blocks could never fill is refused now, with a reason, rather than missing on every request */
    rtk_large_info_t li;
    rtk_large_info(&li);
    if (planned > li.reserved - li.in_use) {
        *why = "its blocks need more memory than the address range rtkit may reserve (RLIMIT_AS / 4)";
        return NULL;
    }
    /* blocks the heap's resident idle extents will hold need no new memory (and are not in MemAvailable) */
    size_t fresh = planned > li.idle ? planned - li.idle : 0, avail = rtk_os_mem_available();
    if (avail != SIZE_MAX && fresh > avail / 2) {
        *why = "not enough available memory for its blocks";
        return NULL;
    }
    size_t meta_size = page_round(sizeof(rtk_arena_t) + nblocks * sizeof(void *));
    rtk_arena_t *a = rtk_os_map(meta_size, 0);
    if (!a) {
        *why = "its metadata could not be mapped";
        return NULL;
    }
    a->slot = slot;
    a->spacing = p->spacing >= 0 && p->spacing < RTK_SPACINGS ? p->spacing : 0;
    a->span = planned;
    a->n = p->nclasses;
    a->debug = debug;
    a->meta_size = meta_size;
    void **stacks = (void **)(a + 1);
    for (int i = 0; i < p->nclasses; i++) {
        rtk_aclass_t *c = &a->cls[i];
        c->size = p->cls[i].size;
        c->blocks = p->cls[i].blocks;
        c->cap = p->cls[i].blocks * GROW_FACTOR;
        c->align = p->cls[i].align;
        c->stack = stacks;
        stacks += c->cap;
    }
    /* The heap's idle resident pages become the classes' blocks first, the largest classes first (they need the
     * longest extents): they cost no fault and no RSS. Only the blocks no resident extent can hold take other
     * pages, faulted in here, inside the step mark, with one call each: left to first use they would cost the
     * first steps after the plan a burst of faults. A block the heap cannot give now is taken when first needed. */
    uint32_t pages[RTK_MAX_CLASSES], live[RTK_MAX_CLASSES];
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            for (int i = 0; i < a->n; i++)
                pages[i] = (uint32_t)(page_round(a->cls[i].size) / rtk_os_page_size());
            rtk_large_count_live(pages, a->n, live);
        }
        for (int i = a->n - 1; i >= 0; i--) {
            rtk_aclass_t *c = &a->cls[i];
            size_t usable, al = c->align > 4096 ? c->align : 4096;
            void *b;
            /* Blocks of this size still live at the mark (the input pipeline's next batch, a step's outputs) are
             * adopted as they are freed (rtk_arena_adopt): fresh pages now would leave theirs idle for good */
            uint32_t want = c->blocks;
            if (pass) {
                uint32_t later = live[i] < c->blocks - c->made ? live[i] : c->blocks - c->made;
                want = c->blocks - later;
                c->awaited = later;
            }
            while (c->made < want &&
                   (b = pass ? rtk_large_alloc(c->size, al, &usable) : rtk_large_alloc_resident(c->size, al, &usable))) {
                if (pass)
                    rtk_os_populate(b, usable);
                rtk_large_set_owner(b, RTK_OWNER_WORD(slot, i));
                c->stack[c->top++] = b;
                c->made++;
            }
        }
    }
    rtk_large_epoch();  /* the decay's high-water mark restarts from the plan's footprint */
    *why = NULL;
    return a;
}

void rtk_arena_destroy(rtk_arena_t *a)
{
    if (a)
        a->span = 0;  /* its blocks went back to the large heap one by one; lookups no longer name it */
}

/* a block leaves its class for the large heap, its pages released or kept resident there (caller holds the class
 * lock) */
static void give_back(rtk_aclass_t *c, void *p, int keep_pages)
{
    size_t bytes;
    rtk_large_set_owner(p, 0);
    c->made--;
    if (keep_pages)
        rtk_large_free(p, &bytes);
    else
        rtk_large_free_release(p, &bytes);
}

static void *pop(rtk_arena_t *a, rtk_aclass_t *c, int k, size_t *bytes)
{
    void *p = NULL;
    int take = 0;
    rtk_spin_lock(&c->lock);
    if (c->top) {
        p = c->stack[--c->top];
        rtk_large_set_owner(p, RTK_OWNER_WORD(a->slot, k) | RTK_OWNER_INUSE);
        c->pops++;
    } else if (c->made < c->blocks) {
        c->made++;  /* counted before the heap is asked, so a racing pop cannot overshoot `blocks` */
        take = 1;
    }
    rtk_spin_unlock(&c->lock);
    if (take) {
        size_t usable;
        p = rtk_large_alloc(c->size, c->align > 4096 ? c->align : 4096, &usable);
        /* a recurring size's block is written whole every step: one populate call instead of a fault per page */
        if (p)
            rtk_os_populate(p, usable);
        rtk_spin_lock(&c->lock);
        if (p) {
            rtk_large_set_owner(p, RTK_OWNER_WORD(a->slot, k) | RTK_OWNER_INUSE);
            c->pops++;
        } else {
            c->made--;
        }
        rtk_spin_unlock(&c->lock);
    }
    if (p) {
        __atomic_add_fetch(&a->live_blocks, 1, __ATOMIC_RELAXED);
        *bytes = c->size;
    }
    return p;
}

/* Every class that could serve the request is exhausted: the smallest that fits will take one more block, while it
 * is under its cap, if it is the class the plan made for this size (a size that only borrows a larger class,
 * another phase's after a change of model, grows nothing: that is the drift check's to see, step.c). The block is
 * this request's own fallback, taken when the job frees it (rtk_arena_adopt): growing faults no page in and takes
 * none from the large heap's idle headroom, which the sizes no class serves fall back on. */
static void want_more(rtk_arena_t *a, int k, size_t size, size_t align)
{
    rtk_aclass_t *c = &a->cls[k];
    if (c->size < size || page_round(c->size) > page_round(rtk_class_round(size, a->spacing)) || align > c->align ||
        c->dropped || a->retired)
        return;
    rtk_spin_lock(&c->lock);
    if (!c->dropped && c->blocks + c->wanted < c->cap)
        c->wanted++;
    rtk_spin_unlock(&c->lock);
}

/* The smallest class that fits; when it is empty, borrow from larger classes up to twice the request (sizes
 * that vary with the batch land one class up now and then); past that, the smallest will grow (want_more). */
void *rtk_arena_alloc(rtk_arena_t *a, size_t size, size_t align, int *why, size_t *bytes)
{
    int lo = 0, hi = a->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (a->cls[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    int seen = 0;
    size_t limit = size > ((size_t)-1) / 2 ? (size_t)-1 : size * 2;
    for (int i = lo; i < a->n && a->cls[i].size <= limit; i++) {
        rtk_aclass_t *c = &a->cls[i];
        if (align > c->align || c->dropped)
            continue;
        seen = 1;
        if (__atomic_load_n(&c->top, __ATOMIC_RELAXED) == 0 && __atomic_load_n(&c->made, __ATOMIC_RELAXED) >= c->blocks)
            continue;
        void *p = pop(a, c, i, bytes);
        if (p) {
            *why = RTK_ARENA_OK;
            return p;
        }
    }
    if (seen && lo < a->n)
        want_more(a, lo, size, align);
    *why = seen ? RTK_ARENA_EXHAUSTED : RTK_ARENA_MISS;
    return NULL;
}

int rtk_arena_free(rtk_arena_t *a, int k, void *p)
{
    if (k < 0 || k >= a->n)
        return -1;
    rtk_aclass_t *c = &a->cls[k];
    uint32_t mine = RTK_OWNER_WORD(a->slot, k);
    rtk_spin_lock(&c->lock);
    /* the owner word checked and cleared under the class lock, in one call: a racing second free of p finds the
     * block back on the stack */
    int keep = !c->dropped && !a->retired;
    uint32_t w = rtk_large_swap_owner(p, mine | RTK_OWNER_INUSE, keep ? mine : 0);
    if (w != (mine | RTK_OWNER_INUSE)) {
        rtk_spin_unlock(&c->lock);
        return w == mine ? -2 : -1;
    }
    if (keep) {
        c->stack[c->top++] = p;  /* top < made <= blocks: the stack has room */
    } else {
        size_t bytes;
        c->made--;
        /* a retired plan's block is what the profile after it allocates again: its pages stay resident in the
         * large heap, whose decay gives them back if nothing does; a dropped class's go */
        if (a->retired && c->keep_pages)
            rtk_large_free(p, &bytes);
        else
            rtk_large_free_release(p, &bytes);
    }
    rtk_spin_unlock(&c->lock);
    __atomic_sub_fetch(&a->live_blocks, 1, __ATOMIC_RELAXED);
    return 0;
}

/* A freed large-heap block (no class's, `bytes` its page-rounded size) joins a class of its size that holds fewer
 * blocks than planned, in place of pages taken afresh when the class next runs short. 1 adopted; 0 not (the caller
 * frees it to the large heap, which also says whether the free was valid). */
int rtk_arena_adopt(rtk_arena_t *a, void *p, size_t bytes)
{
    if (!a || a->retired)
        return 0;
    int lo = 0, hi = a->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (page_round(a->cls[mid].size) < bytes)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int k = lo; k < a->n && page_round(a->cls[k].size) == bytes; k++) {
        rtk_aclass_t *c = &a->cls[k];
        if (c->dropped || (c->align > 4096 && ((uintptr_t)p & (c->align - 1))) ||
            (__atomic_load_n(&c->made, __ATOMIC_RELAXED) >= c->blocks && !__atomic_load_n(&c->wanted, __ATOMIC_RELAXED)))
            continue;
        rtk_spin_lock(&c->lock);
        int room = !c->dropped && c->made < c->blocks, growing = 0;
        if (!room && !c->dropped && c->wanted && c->blocks < c->cap) {
            c->wanted--;  /* a block the class grows by (want_more): this one, freed by the job */
            c->blocks++;
            room = growing = 1;
        }
        if (room)
            c->made++;  /* counted first, as pop does: a racing pop cannot overshoot `blocks` */
        rtk_spin_unlock(&c->lock);
        if (!room)
            continue;
        int r = rtk_large_adopt(p, RTK_OWNER_WORD(a->slot, k));
        rtk_spin_lock(&c->lock);
        if (r == 0) {
            c->stack[c->top++] = p;  /* top < made <= blocks */
            if (growing)
                c->grown++;
            else
                c->adopted++;
            if (c->awaited && !growing)
                c->awaited--;
        } else {
            c->made--;
            if (growing) {
                c->blocks--;
                c->wanted++;
            }
        }
        rtk_spin_unlock(&c->lock);
        return r == 0;
    }
    return 0;
}

/* every block on the class's free stack back to the large heap (caller holds the class lock); returns bytes */
static size_t drain(rtk_aclass_t *c, int keep_pages)
{
    size_t bytes = 0;
    while (c->top) {
        give_back(c, c->stack[--c->top], keep_pages);
        bytes += c->size;
    }
    return bytes;
}

size_t rtk_arena_release_free(rtk_arena_t *a, int all, int keep_pages)
{
    size_t bytes = 0;
    for (int i = 0; a && a->span && i < a->n; i++) {
        rtk_aclass_t *c = &a->cls[i];
        if (!all && !c->dropped)
            continue;
        rtk_spin_lock(&c->lock);
        /* only a class the last steps used: its size is likely the next profile's; an idle one's pages (a rejected
         * plan's sizes the job never asks for) would sit in the heap until its decay */
        c->keep_pages = keep_pages && !c->dropped && c->pops && c->idle_steps < WARM_STEPS;
        bytes += drain(c, c->keep_pages);
        rtk_spin_unlock(&c->lock);
    }
    return bytes;
}

int rtk_arena_recheck(rtk_arena_t *a, uint32_t steps)
{
    int dropped = 0;
    for (int i = 0; a && i < a->n; i++) {
        rtk_aclass_t *c = &a->cls[i];
        uint64_t pops = __atomic_load_n(&c->pops, __ATOMIC_RELAXED);
        if (__atomic_load_n(&c->wanted, __ATOMIC_RELAXED)) {
            /* growth takes the step's own fallback blocks, freed within it: a block of the size freed later may be
             * another of the job's, whose pages the large heap would have given to a larger request */
            rtk_spin_lock(&c->lock);
            c->wanted = 0;
            rtk_spin_unlock(&c->lock);
        }
        if (!steps)
            continue;   /* no decay: classes are never dropped */
        if (c->dropped)
            continue;
        if (pops != c->pops_seen) {
            c->pops_seen = pops;
            c->idle_steps = 0;
            continue;
        }
        if (++c->idle_steps < steps)
            continue;
        dropped++;
        rtk_spin_lock(&c->lock);
        c->dropped = 1;
        drain(c, 0);
        rtk_spin_unlock(&c->lock);
    }
    return dropped;
}

void rtk_arena_usage(const rtk_arena_t *a, size_t *live, size_t *free_bytes, size_t *held)
{
    *live = *free_bytes = *held = 0;
    for (int k = 0; a && a->span && k < a->n; k++) {
        const rtk_aclass_t *c = &a->cls[k];
        uint32_t top = __atomic_load_n(&c->top, __ATOMIC_RELAXED), made = __atomic_load_n(&c->made, __ATOMIC_RELAXED);
        if (top > made)
            top = made;
        *live += (size_t)(made - top) * c->size;
        *free_bytes += (size_t)top * c->size;
        *held += (size_t)made * page_round(c->size);
    }
}

void rtk_arena_lock_all(rtk_arena_t *a)
{
    for (int i = 0; a && i < a->n; i++)
        rtk_spin_fork_prepare(&a->cls[i].lock);
}

void rtk_arena_unlock_all(rtk_arena_t *a)
{
    for (int i = a ? a->n - 1 : -1; i >= 0; i--)
        rtk_spin_fork_parent(&a->cls[i].lock);
}

void rtk_arena_reset_locks(rtk_arena_t *a)
{
    for (int i = 0; a && i < a->n; i++)
        rtk_spin_fork_child(&a->cls[i].lock);
}
