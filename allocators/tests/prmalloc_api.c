/* prmalloc_api.c -- every interposed entry point under LD_PRELOAD: alignment edges, zero sizes, overflow,
 * realloc into/out of arenas, calloc zeroing, usable size, C++ operators by symbol. Expects env
 * RTKIT_MALLOC_PROFILE_START=0 RTKIT_MALLOC_PROFILE_STABLE=2 RTKIT_MALLOC_MIN_SIZE=32K (set by the pytest). */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "prmalloc_test.h"

#define MiB (1u << 20)

static int aligned_to(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

static void fill(void *p, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)p)[i] = (unsigned char)(i * 31 + seed);
}

static int same(const void *p, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)p)[i] != (unsigned char)(i * 31 + seed))
            return 0;
    return 1;
}

static void c_api_basics(void)
{
    volatile size_t huge = SIZE_MAX;  /* volatile: the overflow must be found at run time, not by the compiler */
    void *p = malloc(0);
    CHECK(p != NULL);
    free(p);
    free(NULL);
    p = calloc(0, 16);
    CHECK(p != NULL);
    free(p);
    errno = 0;
    CHECK(calloc(huge / 2, 3) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(reallocarray(NULL, huge / 4, 8) == NULL && errno == ENOMEM);
    p = reallocarray(NULL, 10, 10);
    CHECK(p != NULL && malloc_usable_size(p) >= 100);
    free(p);
    errno = 0;
    CHECK(malloc(huge - 4096) == NULL && errno == ENOMEM);
    p = malloc(10);
    CHECK(realloc(p, 0) == NULL);  /* glibc semantics: frees */
    p = realloc(NULL, 33);
    CHECK(p != NULL);
    free(p);
    char *c = calloc(1000, 1);
    int zero = 1;
    for (int i = 0; i < 1000; i++)
        zero &= c[i] == 0;
    CHECK(zero);
    free(c);

    size_t aligns[] = {8, 16, 32, 64, 128, 4096, 8192, 65536, 1 << 21};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        size_t a = aligns[i];
        void *q = NULL;
        CHECK(posix_memalign(&q, a, 100) == 0 && aligned_to(q, a));
        free(q);
        CHECK(posix_memalign(&q, a, 0) == 0);
        free(q);
        q = aligned_alloc(a, 3 * a);
        CHECK(q && aligned_to(q, a));
        free(q);
        q = memalign(a, 1);
        CHECK(q && aligned_to(q, a));
        free(q);
    }
    void *q = (void *)1;
    CHECK(posix_memalign(&q, 24, 10) == EINVAL && q == (void *)1);
    CHECK(posix_memalign(&q, 4, 10) == EINVAL);   /* < sizeof(void *) */
    CHECK(posix_memalign(&q, 0, 10) == EINVAL);
    errno = 0;
    CHECK(aligned_alloc(24, 48) == NULL && errno == EINVAL);
    q = memalign(24, 10);  /* glibc rounds up to 32 */
    CHECK(q && aligned_to(q, 32));
    free(q);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    q = valloc(10);
    CHECK(q && aligned_to(q, page));
    free(q);
    q = pvalloc(10);
    CHECK(q && aligned_to(q, page) && malloc_usable_size(q) >= page);
    free(q);
    errno = 0;
    CHECK(pvalloc(SIZE_MAX - 10) == NULL && errno == ENOMEM);
    CHECK(malloc_usable_size(NULL) == 0);
}

typedef void *(*new_t)(size_t);
typedef void *(*new_nt_t)(size_t, const void *);
typedef void *(*new_al_t)(size_t, size_t);
typedef void *(*new_al_nt_t)(size_t, size_t, const void *);
typedef void (*del_t)(void *);
typedef void (*del_s_t)(void *, size_t);
typedef void (*del_al_s_t)(void *, size_t, size_t);
typedef void (*del_nt_t)(void *, const void *);
typedef void (*del_al_nt_t)(void *, size_t, const void *);

static void *sym(const char *name)
{
    void *f = dlsym(RTLD_DEFAULT, name);
    if (!f)
        fprintf(stderr, "FAIL: symbol %s not found\n", name), g_failures++;
    return f;
}

static void cxx_operators(void)
{
    char nt = 0;
    const char *plain[] = {"_Znwm", "_Znam"};
    const char *del[] = {"_ZdlPv", "_ZdaPv"};
    const char *dels[] = {"_ZdlPvm", "_ZdaPvm"};
    const char *nothrow[] = {"_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t"};
    const char *delnt[] = {"_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t"};
    const char *al[] = {"_ZnwmSt11align_val_t", "_ZnamSt11align_val_t"};
    const char *alnt[] = {"_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t"};
    const char *delal[] = {"_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t"};
    const char *delals[] = {"_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t"};
    const char *delalnt[] = {"_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t"};
    for (int k = 0; k < 2; k++) {
        new_t n = sym(plain[k]);
        new_nt_t nn = sym(nothrow[k]);
        new_al_t na = sym(al[k]);
        new_al_nt_t nan = sym(alnt[k]);
        del_t d = sym(del[k]), dal_plain = NULL;
        del_s_t ds = sym(dels[k]);
        del_nt_t dn = sym(delnt[k]);
        del_s_t dal = sym(delal[k]);
        del_al_s_t dals = sym(delals[k]);
        del_al_nt_t dalnt = sym(delalnt[k]);
        (void)dal_plain;
        if (g_failures)
            return;
        void *p = n(24);
        CHECK(p && aligned_to(p, 16));
        d(p);
        p = n(0);
        CHECK(p != NULL);
        ds(p, 0);
        p = n(100 << 10);  /* large: may come from an arena later */
        CHECK(p != NULL);
        ds(p, 100 << 10);
        p = nn(40, &nt);
        CHECK(p != NULL);
        dn(p, &nt);
        CHECK(nn(SIZE_MAX - 100, &nt) == NULL);
        p = na(100, 256);
        CHECK(p && aligned_to(p, 256));
        dal(p, 256);
        p = na(1000, 8192);
        CHECK(p && aligned_to(p, 8192));
        dals(p, 1000, 8192);
        p = nan(64, 64, &nt);
        CHECK(p && aligned_to(p, 64));
        dalnt(p, 64, &nt);
        CHECK(nan(SIZE_MAX - 100, 64, &nt) == NULL);
    }
}

/* Recurring steps: 2 x 1 MiB, 1 x 300 KiB and 1 x 64 KiB live together, freed by the end of the step. */
static void one_step(void)
{
    void *a = malloc(MiB), *b = malloc(MiB), *c = malloc(300 << 10), *d = NULL;
    CHECK(posix_memalign(&d, 64, 64 << 10) == 0);
    memset(a, 1, MiB);
    memset(b, 2, MiB);
    memset(c, 3, 300 << 10);
    memset(d, 4, 64 << 10);
    free(c);
    free(a);
    free(d);
    free(b);
    t_mark();
}

static void arenas(void)
{
    for (int i = 0; i < 12 && t_state() != 3; i++)
        one_step();
    CHECK(t_state() == 3);
    void *a = malloc(MiB);
    CHECK(t_in_arena(a));
    CHECK(malloc_usable_size(a) >= MiB);
    /* shrink within the arena keeps the block */
    fill(a, 900 << 10, 7);
    void *b = realloc(a, 900 << 10);
    CHECK(b == a && same(b, 900 << 10, 7));
    /* shrink below min_size moves out to glibc */
    void *c = realloc(b, 1000);
    CHECK(c && !t_in_arena(c) && same(c, 1000, 7));
    /* growth of a glibc block stays glibc's (in place wherever glibc can, as without rtkit) */
    fill(c, 1000, 9);
    void *d = realloc(c, MiB - 100);
    CHECK(d && !t_in_arena(d) && same(d, 1000, 9));
    /* growth out of the arena (larger than any class) */
    fill(d, MiB - 100, 11);
    void *e = realloc(d, 20 * MiB);
    CHECK(e && !t_in_arena(e) && same(e, MiB - 100, 11));
    free(e);
    /* calloc from an arena block that held data is zeroed */
    void *f = malloc(300 << 10);
    CHECK(t_in_arena(f));
    memset(f, 0xAB, 300 << 10);
    free(f);
    unsigned char *g = calloc(300 << 10, 1);
    int zero = 1;
    for (size_t i = 0; i < (300u << 10); i++)
        zero &= g[i] == 0;
    CHECK(zero && t_in_arena(g));
    free(g);
    /* alignment: arena blocks of 1 MiB are page aligned; a stricter request goes to the large heap, aligned */
    void *h = NULL;
    CHECK(posix_memalign(&h, 4096, MiB) == 0 && aligned_to(h, 4096) && t_in_arena(h));
    free(h);
    CHECK(posix_memalign(&h, 1 << 16, MiB) == 0 && aligned_to(h, 1 << 16) && t_in_arena(h));
    free(h);
    /* exhaustion: more live 1 MiB blocks than planned -> the rest comes from the large heap, all usable */
    void *many[16];
    int in = 0;
    for (int i = 0; i < 16; i++) {
        many[i] = malloc(MiB);
        CHECK(many[i] != NULL);
        memset(many[i], i, MiB);
        in += t_in_arena(many[i]);
    }
    CHECK(in == 16);
    for (int i = 0; i < 16; i++)
        free(many[i]);
    /* a size between classes borrows the next class up (<= 2x) */
    void *k = malloc(200 << 10);
    CHECK(t_in_arena(k));
    free(k);
    /* C++ new of a planned size lands in the arena too */
    new_t n = sym("_Znwm");
    del_s_t ds = sym("_ZdlPvm");
    void *x = n(MiB);
    CHECK(t_in_arena(x));
    ds(x, MiB);
    one_step();
}

int main(void)
{
    test_bind();
    c_api_basics();
    cxx_operators();
    arenas();
    return test_done("prmalloc_api");
}
