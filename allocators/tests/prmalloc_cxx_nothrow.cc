// prmalloc_cxx_nothrow.cc -- nothrow operator new runs the new-handler loop before it returns nullptr, as libstdc++'s does.
#include <stdint.h>
#include <stdio.h>

#include <new>

#include "prmalloc_test.h"

static volatile size_t g_huge = SIZE_MAX / 2;  // no allocator can serve it; volatile: not folded at compile time
static int g_calls;

static void handler_once()
{
    g_calls++;
    std::set_new_handler(nullptr);  // the next failure ends the loop: nothrow new then returns nullptr
}

int main()
{
    test_bind();
    const size_t n = g_huge;
    std::set_new_handler(handler_once);
    void *p = ::operator new(n, std::nothrow);
    CHECK(p == nullptr && g_calls == 1);
    std::set_new_handler(handler_once);
    p = ::operator new[](n, std::nothrow);
    CHECK(p == nullptr && g_calls == 2);
    std::set_new_handler(handler_once);
    p = ::operator new(n, std::align_val_t(64), std::nothrow);
    CHECK(p == nullptr && g_calls == 3);
    std::set_new_handler(handler_once);
    p = ::operator new[](n, std::align_val_t(64), std::nothrow);
    CHECK(p == nullptr && g_calls == 4);
    // a handler that frees memory and lets the retry succeed is the loop's point: here it only counts
    p = ::operator new(64, std::nothrow);
    CHECK(p != nullptr);
    ::operator delete(p);
    return test_done("prmalloc_cxx_nothrow");
}
