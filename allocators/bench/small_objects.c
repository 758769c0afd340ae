/* small_objects.c -- micro-benchmark of the small-object path: malloc/free pairs of 16..512 bytes with a rolling
 * live set (hash-node-like), no step marks. Usage: small_objects [pairs]. Prints one key=value line. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LIVE 1024

int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 20000000;
    void *live[LIVE] = {0};
    uint64_t s = 7;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < pairs; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        unsigned k = (unsigned)(s >> 40) % LIVE;
        free(live[k]);
        live[k] = malloc(16 + (size_t)((s >> 20) % 497));
        *(volatile char *)live[k] = 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (int k = 0; k < LIVE; k++)
        free(live[k]);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)pairs;
    printf("bench=small_objects ns_per_pair=%.2f pairs=%ld\n", ns, pairs);
    return 0;
}
