/* log.c -- one-line stderr logging for the native libraries (no stdio buffers, no allocation). */
#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void rtk_log_vline(const char *fmt, va_list ap)
{
    char buf[1024];
    int saved = errno;  /* logging must not disturb the errno a caller is about to return */
    int n = snprintf(buf, sizeof buf, "rtkit: ");
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + ((size_t)m < sizeof buf - (size_t)n - 1 ? (size_t)m : sizeof buf - (size_t)n - 2);
    buf[len++] = '\n';
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(2, buf + off, len - off);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            break;
        }
        off += (size_t)w;
    }
    errno = saved;
}

void rtk_log_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rtk_log_vline(fmt, ap);
    va_end(ap);
}
