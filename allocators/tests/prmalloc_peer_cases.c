/* prmalloc_peer_cases.c -- the kinds of cases the peers' own suites check (huge alignments, errno of too-large
 * requests, fork from a signal handler and beside stdio, RLIMIT_AS lowered at run time, bad pointers), run under
 * LD_PRELOAD. argv[1] names the case; argv[2] "marks" also marks steps as it runs (profiling, then a plan), so each
 * case meets the allocator in its planned state too. Cases that must abort print what went wrong if they survive. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prmalloc_test.h"

/* requests too large on purpose, and blocks still the caller's after a realloc that failed */
#pragma GCC diagnostic ignored "-Walloc-size-larger-than="
#pragma GCC diagnostic ignored "-Wuse-after-free"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static int g_marks;

/* one step of recurring large blocks (what a plan is made of), then a step mark when this run marks steps */
static void step(void)
{
    void *a = malloc(MiB), *b = malloc(256 * KiB);
    memset(a, 1, MiB);
    memset(b, 2, 256 * KiB);
    free(b);
    free(a);
    if (g_marks)
        t_mark();
}

static void steps(int n)
{
    for (int i = 0; i < n; i++)
        step();
}

/* ---------------------------------------------------------------- alignment */

/* Alignments the address space cannot hold fail with ENOMEM as glibc's do, and never hand out a live block. */
static void huge_align(void)
{
    steps(8);
    enum { LIVE = 8 };
    unsigned char *live[LIVE];
    for (int i = 0; i < LIVE; i++) {
        live[i] = malloc(64 * KiB);
        memset(live[i], 0x40 + i, 64 * KiB);
    }
    static const size_t sizes[] = {32 * KiB, MiB};
    for (int k = 40; k <= 63; k++) {
        size_t al = (size_t)1 << k;
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            void *p = (void *)0x1;
            errno = 1234;
            CHECK(posix_memalign(&p, al, sizes[s]) == ENOMEM && p == (void *)0x1 && errno == ENOMEM);  /* errno as glibc's */
            errno = 0;
            void *q = aligned_alloc(al, sizes[s]);
            CHECK(q == NULL && errno == ENOMEM);
            errno = 0;
            void *r = memalign(al, sizes[s]);
            CHECK(r == NULL && errno == ENOMEM);
            for (int i = 0; i < LIVE; i++)
                CHECK(q != live[i] && r != live[i]);
        }
    }
    for (int i = 0; i < LIVE; i++) {
        for (size_t b = 0; b < 64 * KiB; b += 4093)
            CHECK(live[i][b] == 0x40 + i);
        free(live[i]);
    }
    /* alignments that fit are still served, aligned */
    for (int k = 12; k <= 26; k++) {
        size_t al = (size_t)1 << k;
        void *p = NULL;
        CHECK(posix_memalign(&p, al, 40 * KiB) == 0 && p && ((uintptr_t)p & (al - 1)) == 0);
        if (p)
            memset(p, 3, 40 * KiB);
        free(p);
        step();
    }
}

/* ---------------------------------------------------------------- errno of requests too large to serve */

#define TOO_LARGE(call) do { errno = 0; void *r_ = (call); CHECK(r_ == NULL && errno == ENOMEM); } while (0)

static void too_large_once(void)
{
    static const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 4096, (size_t)PTRDIFF_MAX + 1, (size_t)PTRDIFF_MAX,
                                   (size_t)1 << 62};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        TOO_LARGE(malloc(n));
        TOO_LARGE(calloc(1, n));
        TOO_LARGE(calloc(n, 1));
        TOO_LARGE(valloc(n));
        TOO_LARGE(pvalloc(n));
        TOO_LARGE(aligned_alloc(64, n));
        TOO_LARGE(aligned_alloc(8192, n));
        TOO_LARGE(memalign(64, n));
        TOO_LARGE(memalign(1 << 20, n));
        void *p = (void *)0x1;
        errno = 77;
        CHECK(posix_memalign(&p, 64, n) == ENOMEM && p == (void *)0x1 && errno == ENOMEM);  /* glibc sets errno too */
        errno = 77;
        CHECK(posix_memalign(&p, 1 << 16, n) == ENOMEM && p == (void *)0x1 && errno == ENOMEM);
        /* a block the request cannot grow stays the caller's, untouched */
        static const size_t olds[] = {100, 64 * KiB, MiB};
        for (size_t j = 0; j < sizeof olds / sizeof olds[0]; j++) {
            unsigned char *old = malloc(olds[j]);
            memset(old, 0x5a, olds[j]);
            TOO_LARGE(realloc(old, n));
            TOO_LARGE(reallocarray(old, n, 1));
            CHECK(old[0] == 0x5a && old[olds[j] - 1] == 0x5a);
            free(old);
        }
    }
    /* the product overflows */
    TOO_LARGE(calloc((SIZE_MAX >> 1) + 2, 2));
    TOO_LARGE(calloc(SIZE_MAX, SIZE_MAX));
    void *old = malloc(200);
    TOO_LARGE(reallocarray(old, (SIZE_MAX >> 1) + 2, 2));
    free(old);
    /* memalign: 2^63 is a power of two (too large: ENOMEM); above it no alignment is one (EINVAL) */
    TOO_LARGE(memalign((size_t)1 << 63, 64));
    errno = 0;
    CHECK(memalign(((size_t)1 << 63) + 1, 64) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(memalign(SIZE_MAX, 64) == NULL && errno == EINVAL);
    /* posix_memalign: an alignment that is not a power of two times sizeof(void *) is EINVAL */
    void *p = (void *)0x1;
    CHECK(posix_memalign(&p, 24, 64) == EINVAL && p == (void *)0x1);
    CHECK(posix_memalign(&p, 0, 64) == EINVAL && p == (void *)0x1);
    CHECK(posix_memalign(&p, 4, 64) == EINVAL && p == (void *)0x1);
}

static void too_large(void)
{
    too_large_once();   /* before any plan */
    steps(10);
    too_large_once();   /* planned when this run marks steps */
}

/* ---------------------------------------------------------------- fork */

static volatile sig_atomic_t g_forks;

static void fork_handler(int sig)
{
    (void)sig;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid > 0) {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        g_forks++;
    }
    errno = saved;
}

/* Signals from another process (so this one stays single-threaded, as in glibc's own test) land anywhere in
 * large and small mallocs and frees; the handler forks and the child exits at once. Must not hang. The sender
 * signals again once this process made some more allocations (a shared counter), so allocation goes on between
 * forks however slow fork is on a loaded machine. */
static void fork_signal(void)
{
    enum { FORKS = 300, EVERY = 48 };
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fork_handler;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    volatile unsigned long *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED);
    if (shared == MAP_FAILED)
        return;
    pid_t parent = getpid(), sender = fork();
    if (sender == 0) {
        unsigned long last = 0;
        while (getppid() == parent) {
            if (shared[0] >= last + EVERY) {
                last = shared[0];
                kill(parent, SIGUSR1);
            }
            usleep(100);
        }
        _exit(0);
    }
    static const size_t sizes[] = {24, 200, 4 * KiB, 40 * KiB, 300 * KiB, MiB, 3 * MiB};
    void *keep[16] = {0};
    unsigned long it = 0;
    while (g_forks < FORKS) {
        size_t n = sizes[it % (sizeof sizes / sizeof sizes[0])];
        unsigned k = (unsigned)(it * 7 % 16);
        free(keep[k]);
        keep[k] = (it & 3) == 1 ? calloc(1, n) : malloc(n);
        if (keep[k])
            ((char *)keep[k])[n - 1] = 1;
        if ((it & 15) == 5) {
            void *q = realloc(keep[k], n * 2);
            if (q)
                keep[k] = q;
        }
        if ((it & 31) == 9) {
            void *a = NULL;
            if (posix_memalign(&a, 64 * KiB, n) == 0)
                free(a);
        }
        if (g_marks && (it & 63) == 0)
            t_mark();
        shared[0] = ++it;
    }
    kill(sender, SIGKILL);
    waitpid(sender, NULL, 0);
    for (int k = 0; k < 16; k++)
        free(keep[k]);
    fprintf(stderr, "fork_signal: %d forks from the handler, %lu allocations\n", (int)g_forks, it);
}

/* glibc's fork/stdio pattern: threads read long lines with getdelim (which reallocs its buffer while holding the
 * FILE's lock), others write with fprintf and flush every stream (fflush(NULL) holds the stream list lock and
 * waits for each FILE's), one reallocs, and the main thread forks. Must not hang. */
static volatile int g_stop;
static char *g_text;
static size_t g_text_len;

static void *reader(void *arg)
{
    (void)arg;
    FILE *f = fmemopen(g_text, g_text_len, "r");
    while (f && !g_stop) {
        char *line = NULL;
        size_t cap = 0;
        rewind(f);
        while (getdelim(&line, &cap, '\n', f) > 0 && !g_stop)
            usleep(20);  /* glibc's FILE lock is not fair: a reader that never pauses starves fflush(NULL) */
        free(line);
    }
    if (f)
        fclose(f);
    return NULL;
}

static void *writer(void *arg)
{
    (void)arg;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    for (unsigned long i = 0; f && !g_stop; i++) {
        fprintf(f, "%lu %s\n", i, "a line long enough to grow the stream's buffer now and then");
        if ((i & 1023) == 0) {
            fflush(NULL);
            usleep(50);
            fseek(f, 0, SEEK_SET);
        }
    }
    if (f)
        fclose(f);
    free(buf);
    return NULL;
}

static void *flusher(void *arg)
{
    (void)arg;
    while (!g_stop) {
        fflush(NULL);
        usleep(50);  /* a tight loop would keep the stream list lock from fork for long stretches */
    }
    return NULL;
}

static void *reallocer(void *arg)
{
    (void)arg;
    void *p = NULL;
    for (unsigned long i = 0; !g_stop; i++) {
        void *q = realloc(p, (i % 64 + 1) * 16 * KiB);
        if (q)
            p = q;
        if ((i & 63) == 63) {
            free(p);
            p = NULL;
        }
    }
    free(p);
    return NULL;
}

static void fork_stdio(void)
{
    enum { FORKS = 200, LINE = 96 * KiB, LINES = 8 };
    g_text_len = (size_t)LINE * LINES;
    g_text = malloc(g_text_len);
    memset(g_text, 'x', g_text_len);
    for (int i = 1; i <= LINES; i++)
        g_text[(size_t)i * LINE - 1] = '\n';
    pthread_t th[6];
    void *(*fn[6])(void *) = {reader, reader, writer, flusher, reallocer, reallocer};
    for (int i = 0; i < 6; i++)
        CHECK(pthread_create(&th[i], NULL, fn[i], NULL) == 0);
    for (int i = 0; i < FORKS; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* the child's stdio and malloc work after fork */
            char *line = NULL;
            size_t cap = 0;
            FILE *f = fmemopen(g_text, g_text_len, "r");
            if (!f || getdelim(&line, &cap, '\n', f) != (ssize_t)LINE)
                _exit(3);
            fclose(f);
            free(line);
            _exit(0);
        }
        CHECK(pid > 0);
        int st = 0;
        if (pid > 0) {
            CHECK(waitpid(pid, &st, 0) == pid);
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
        if (g_marks && (i & 7) == 0)
            step();
    }
    g_stop = 1;
    for (int i = 0; i < 6; i++)
        pthread_join(th[i], NULL);
    free(g_text);
}

/* ---------------------------------------------------------------- limits */

/* a /proc/self/status figure in bytes ("VmSize", "VmHWM") */
static size_t status_bytes(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0, klen = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':' && sscanf(line + klen + 1, "%zu", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * KiB;
}

static void *thread_work(void *arg)
{
    (void)arg;
    for (int i = 0; i < 50; i++) {
        void *a = malloc(100 + (size_t)i), *b = malloc(64 * KiB + (size_t)i * 4096);
        if (b)
            memset(b, 1, 4096);
        free(b);
        free(a);
    }
    return NULL;
}

/* lower RLIMIT_AS to `limit` now, then start `count` threads (attr: NULL or small stacks) running thread_work and
 * join them; every one must start */
static void threads_under_limit(const char *name, size_t limit, int count, const pthread_attr_t *attr)
{
    fprintf(stderr, "%s: VmSize %zu MiB before lowering RLIMIT_AS to %zu MiB\n", name, status_bytes("VmSize") / MiB,
            limit / MiB);
    struct rlimit rl;
    getrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = limit;
    CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
    pthread_t th[64];
    int made = 0;
    for (int i = 0; i < count && i < 64; i++) {
        int rc = pthread_create(&th[made], attr, thread_work, NULL);
        CHECK(rc == 0);
        if (rc == 0)
            made++;
    }
    for (int i = 0; i < made; i++)
        pthread_join(th[i], NULL);
    fprintf(stderr, "%s: %d of %d threads started\n", name, made, count);
}

/* untouched 64 MiB blocks until the limit refuses one (NULL with ENOMEM), then all freed; how many were held */
static int large_until_enomem(int most)
{
    void *held[128];
    int n = 0;
    errno = 0;
    while (n < most && n < 128 && (held[n] = malloc(64 * MiB)) != NULL)
        n++;
    CHECK(n < most && errno == ENOMEM);
    for (int i = n; i > 0; i--)
        free(held[i - 1]);
    return n;
}

/* A program that lowers RLIMIT_AS well below what rtkit could ever use (as glibc's and CPython's tests do)
 * still creates threads and allocates; requests past the limit fail with ENOMEM, not a crash. */
static void rlimit_threads(void)
{
    steps(6);
    threads_under_limit("rlimit_threads", (size_t)4 << 30, 50, NULL);
    CHECK(large_until_enomem(128) > 4);
    steps(4);  /* all freed: threads start again */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thread_work, NULL) == 0);
    pthread_join(t, NULL);
}

/* glibc's tst-malloc-thread-fail: RLIMIT_AS lowered to 200 MiB after start, glibc held to two arenas, eight threads
 * on small stacks. rtkit's share of the address space at start must leave room for them (its page map and first
 * piece took 512 MiB), and its large blocks past the limit fail with ENOMEM. */
static void rlimit_200m(void)
{
    steps(6);
    CHECK(mallopt(M_ARENA_MAX, 2) == 1);
    pthread_attr_t small;
    pthread_attr_init(&small);
    pthread_attr_setstacksize(&small, 256 * KiB);
    threads_under_limit("rlimit_200m", 200 * MiB, 8, &small);
    large_until_enomem(8);
    pthread_attr_destroy(&small);
}

/* Without a limit, the large-object heap grows far past its first piece and every block is still its own. */
static void heap_growth(void)
{
    enum { N = 48 };
    unsigned char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = malloc(32 * MiB + (size_t)i * 4096);
        CHECK(p[i] && t_in_arena(p[i]));
        if (p[i]) {
            p[i][0] = (unsigned char)i;
            p[i][32 * MiB - 1] = (unsigned char)i;
        }
        if (i % 8 == 0)
            step();
    }
    for (int i = 0; i < N; i++) {
        CHECK(p[i][0] == (unsigned char)i && p[i][32 * MiB - 1] == (unsigned char)i);
        free(p[i]);
    }
}

/* A loaded plan's footprint is what its blocks take (a page each at least), never more than the arena limit:
 * the test loads a plan of many small blocks under a small limit */
static void plan_footprint(void)
{
    g_marks = 1;
    steps(4);
    fprintf(stderr, "plan_footprint: peak RSS %zu MiB\n", status_bytes("VmHWM") / MiB);
    CHECK(status_bytes("VmHWM") < 200 * MiB);
}

/* ---------------------------------------------------------------- RTKIT_MALLOC_DEBUG on a correct program */

/* Adjacent large blocks of mixed sizes and alignments, filled with bytes that include the poison value, freed,
 * shrunk and reallocated: the debug check must find no write after free in a program that makes none. */
static void debug_churn(void)
{
    enum { SLOTS = 24 };
    static const size_t sizes[] = {32 * KiB, 36 * KiB, 48 * KiB, 100 * KiB, 260 * KiB, 520 * KiB, MiB};
    unsigned char *slot[SLOTS] = {0};
    uint64_t s = 88172645463325252ull;
    for (int it = 0; it < 6000; it++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        int k = (int)(s % SLOTS);
        free(slot[k]);
        size_t n = sizes[(s >> 8) % (sizeof sizes / sizeof sizes[0])];
        void *p = NULL;
        if ((s >> 20) % 4 == 0) {
            if (posix_memalign(&p, (size_t)8192 << ((s >> 24) % 4), n))
                p = NULL;
        } else {
            p = malloc(n);
        }
        slot[k] = p;
        if (!p)
            continue;
        for (size_t b = 0; b < n; b++)
            slot[k][b] = (unsigned char)(b * 131 + (size_t)it);
        if ((s >> 30) % 5 == 0) {  /* shrink in place: the freed tail starts inside program data */
            void *q = realloc(slot[k], n / 3);
            if (q)
                slot[k] = q;
        }
        if (it % 200 == 199)
            step();
    }
    for (int k = 0; k < SLOTS; k++)
        free(slot[k]);
}

/* ---------------------------------------------------------------- bad pointers into rtkit's memory */

static void *arena_block(void)
{
    g_marks = 1;  /* a plan is what these cases need */
    steps(12);
    CHECK(t_state() == 3);
    void *p = malloc(MiB);
    CHECK(p && t_in_arena(p));
    return p;
}

/* realloc of a freed planned block aborts (glibc: "realloc(): invalid pointer"); it must never be handed out
 * again while the next malloc also gets it */
static void realloc_freed(void)
{
    void *p = arena_block();
    free(p);
    void *q = realloc(p, 512 * KiB);
    void *r = malloc(MiB);
    printf("survived realloc of a freed block%s\n", q == r || q == p ? ": the block was handed out twice" : "");
}

/* malloc_usable_size of a freed block reports no usable bytes (glibc gives 0 for a free chunk) */
static void usable_freed(void)
{
    void *p = arena_block();
    CHECK(malloc_usable_size(p) >= MiB);
    free(p);
    CHECK(malloc_usable_size(p) == 0);
    void *big = malloc(5 * MiB);  /* a large-heap block no class holds */
    free(big);
    CHECK(malloc_usable_size(big) == 0);
}

/* RTKIT_MALLOC_LARGE=0: a fallback block kept for reuse once planned; freeing it twice aborts like glibc */
static void stash_double_free(void)
{
    arena_block();
    void *p = malloc(600 * KiB);  /* a size no class holds: glibc's, kept at free for the next fallback */
    CHECK(p && !t_in_arena(p));
    free(p);
    free(p);
    void *q = malloc(600 * KiB), *r = malloc(600 * KiB);
    printf("survived a double free%s\n", q == r ? ": the same block was handed out twice" : "");
}

int main(int argc, char **argv)
{
    static const struct { const char *name; void (*fn)(void); } cases[] = {
        {"huge_align", huge_align}, {"too_large", too_large}, {"fork_signal", fork_signal},
        {"fork_stdio", fork_stdio}, {"rlimit_threads", rlimit_threads}, {"rlimit_200m", rlimit_200m},
        {"heap_growth", heap_growth},
        {"debug_churn", debug_churn}, {"realloc_freed", realloc_freed}, {"usable_freed", usable_freed},
        {"stash_double_free", stash_double_free}, {"plan_footprint", plan_footprint},
    };
    test_bind();
    g_marks = argc > 2 && !strcmp(argv[2], "marks");
    for (size_t i = 0; argc > 1 && i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(argv[1], cases[i].name)) {
            cases[i].fn();
            char name[80];
            snprintf(name, sizeof name, "prmalloc_peer_cases %s", argv[1]);
            return test_done(name);
        }
    fprintf(stderr, "usage: prmalloc_peer_cases CASE [marks]\n");
    return 2;
}
