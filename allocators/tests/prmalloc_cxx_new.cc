// prmalloc_cxx_new.cc -- C++ operator new/delete under the preload: bad_alloc/nothrow on failure, every form routed.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <new>

#include "prmalloc_test.h"

static volatile size_t g_huge = SIZE_MAX / 2;  // no allocator can serve it; volatile: not folded at compile time
static void *volatile g_sink;
static int g_handler_calls;

static void handler_once()
{
    // the new-handler loop must run (libstdc++ owns it: our failing operator new hands over to it); uninstall
    // so the next try throws
    g_handler_calls++;
    std::set_new_handler(nullptr);
}

// every operator new/delete form (Itanium names) must resolve to the preloaded library, not libstdc++
static const char *const k_forms[] = {
    "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};

static void check_routing()
{
    for (const char *name : k_forms) {
        void *f = dlsym(RTLD_DEFAULT, name);
        Dl_info info;
        int ok = f && dladdr(f, &info) && info.dli_fname && strstr(info.dli_fname, "librtkit_malloc");
        if (!ok)
            fprintf(stderr, "FAIL: %s resolves to %s\n", name, f && dladdr(f, &info) ? info.dli_fname : "nothing");
        CHECK(ok);
    }
}

static void check_failures()
{
    int threw = 0;
    try {
        g_sink = new char[g_huge];
    } catch (const std::bad_alloc &) {
        threw = 1;
    }
    CHECK(threw);
    threw = 0;
    try {
        g_sink = ::operator new(g_huge);
    } catch (const std::bad_alloc &) {
        threw = 1;
    }
    CHECK(threw);
    threw = 0;
    try {
        g_sink = ::operator new[](g_huge, std::align_val_t(4096));
    } catch (const std::bad_alloc &) {
        threw = 1;
    }
    CHECK(threw);
    threw = 0;
    std::set_new_handler(handler_once);
    try {
        g_sink = ::operator new(g_huge);
    } catch (const std::bad_alloc &) {
        threw = 1;
    }
    CHECK(threw && g_handler_calls == 1);
    CHECK(new (std::nothrow) char[g_huge] == nullptr);
    CHECK(::operator new(g_huge, std::nothrow) == nullptr);
    CHECK(::operator new[](g_huge, std::nothrow) == nullptr);
    CHECK(::operator new(g_huge, std::align_val_t(64), std::nothrow) == nullptr);
    CHECK(::operator new[](g_huge, std::align_val_t(4096), std::nothrow) == nullptr);
}

// After the plan, a block of each form must come from the arena, and its delete form must hand it back to the
// arena: the next allocation of the class gets the same block (the class's free stack is LIFO).
static const size_t BIG = 1 << 20, ALIGNED = 256 << 10;
static const std::align_val_t AL{4096};

static void profile_steps()
{
    for (int step = 0; step < 8 && t_state() != 3; step++) {
        void *a = ::operator new(BIG), *b = ::operator new[](BIG);
        void *c = ::operator new(ALIGNED, AL), *d = ::operator new[](ALIGNED, AL);
        memset(a, 1, BIG);
        g_sink = b;
        ::operator delete(a);
        ::operator delete[](b);
        ::operator delete(c, AL);
        ::operator delete[](d, AL);
        t_mark();
    }
}

#define ROUND_TRIP(alloc, release)                                     \
    do {                                                               \
        void *p_ = (alloc);                                            \
        uintptr_t was_ = (uintptr_t)p_; /* compared, never used, after the release */ \
        CHECK(p_ != nullptr && t_in_arena(p_));                        \
        release;                                                       \
        void *q_ = (alloc);                                            \
        if ((uintptr_t)q_ != was_)                                     \
            fprintf(stderr, "FAIL: %s did not return its block to the arena\n", #release); \
        CHECK((uintptr_t)q_ == was_);                                  \
        free(q_);                                                      \
    } while (0)

static void check_arena_forms()
{
    CHECK(t_state() == 3);
    if (t_state() != 3)
        return;
    ROUND_TRIP(::operator new(BIG), ::operator delete(p_));
    ROUND_TRIP(::operator new(BIG), ::operator delete(p_, BIG));
    ROUND_TRIP(::operator new[](BIG), ::operator delete[](p_));
    ROUND_TRIP(::operator new[](BIG), ::operator delete[](p_, BIG));
    ROUND_TRIP(::operator new(BIG, std::nothrow), ::operator delete(p_, std::nothrow));
    ROUND_TRIP(::operator new[](BIG, std::nothrow), ::operator delete[](p_, std::nothrow));
    ROUND_TRIP(::operator new(ALIGNED, AL), ::operator delete(p_, AL));
    ROUND_TRIP(::operator new(ALIGNED, AL), ::operator delete(p_, ALIGNED, AL));
    ROUND_TRIP(::operator new[](ALIGNED, AL), ::operator delete[](p_, AL));
    ROUND_TRIP(::operator new[](ALIGNED, AL), ::operator delete[](p_, ALIGNED, AL));
    ROUND_TRIP(::operator new(ALIGNED, AL, std::nothrow), ::operator delete(p_, AL, std::nothrow));
    ROUND_TRIP(::operator new[](ALIGNED, AL, std::nothrow), ::operator delete[](p_, AL, std::nothrow));
    void *p = ::operator new(ALIGNED, AL);
    CHECK(((uintptr_t)p & 4095) == 0);
    ::operator delete(p, AL);
    // and a new-expression of an object type
    struct alignas(64) Node { char payload[BIG]; };
    Node *n = new Node;
    CHECK(t_in_arena(n) && ((uintptr_t)n & 63) == 0);
    delete n;
}

int main()
{
    test_bind();
    check_routing();
    check_failures();
    profile_steps();
    check_arena_forms();
    return test_done("prmalloc_cxx_new");
}
