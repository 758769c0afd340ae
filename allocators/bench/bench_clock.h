/* bench_clock.h -- the clock and fault counter the C benchmarks share: monotonic seconds, this process's minor faults. */
#ifndef RTK_BENCH_CLOCK_H
#define RTK_BENCH_CLOCK_H

#include <sys/resource.h>
#include <time.h>

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline long bench_minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

#endif
