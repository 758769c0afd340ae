/* prmalloc_fork.c -- fork from a multithreaded process while other threads allocate (arenas active), the child
 * allocates and frees from arenas and glibc, marks a step and exits; then fork+exec of a preloaded program. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prmalloc_test.h"

static volatile int g_stop;

static void *busy(void *arg)
{
    (void)arg;
    while (!g_stop) {
        void *a = malloc(1 << 20), *b = malloc(100), *c = NULL;
        if (posix_memalign(&c, 64, 256 << 10))
            c = NULL;
        memset(a, 1, 4096);
        memset(b, 2, 100);
        free(b);
        free(a);
        free(c);
    }
    return NULL;
}

static void step(void)
{
    void *a = malloc(1 << 20), *c = NULL;
    if (posix_memalign(&c, 64, 256 << 10))
        c = NULL;
    memset(a, 1, 1 << 20);
    memset(c, 1, 256 << 10);
    free(a);
    free(c);
    t_mark();
}

int main(int argc, char **argv)
{
    test_bind();
    if (argc > 1 && !strcmp(argv[1], "child-exec")) {
        step();
        return test_done("prmalloc_fork(exec child)");
    }
    for (int i = 0; i < 8 && t_state() != 3; i++)
        step();
    CHECK(t_state() == 3);
    pthread_t th[4];
    for (int t = 0; t < 4; t++)
        pthread_create(&th[t], NULL, busy, NULL);
    for (int i = 0; i < 40; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *a = malloc(1 << 20);
            void *b = malloc(50);
            int ok = a && b;  /* the arena may be exhausted by the busy threads' blocks: any source is fine */
            memset(a, 3, 1 << 20);
            free(a);
            free(b);
            step();
            _exit(ok ? 0 : 3);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    for (int i = 0; i < 5; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            execl("/proc/self/exe", argv[0], "child-exec", (char *)NULL);
            _exit(4);
        }
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    g_stop = 1;
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    step();
    return test_done("prmalloc_fork");
}
