/* log.h -- rtkit's native logging: one formatted line to stderr through write(2), never stdout, no malloc. */
#ifndef RTK_COMMON_LOG_H
#define RTK_COMMON_LOG_H

#include <stdarg.h>

#define RTK_HIDDEN __attribute__((visibility("hidden")))

/* Write "rtkit: <message>\n" to stderr (fd 2) in a single write so lines from threads do not interleave.
 * Formats into a stack buffer (lines longer than 1 KiB are cut); safe inside malloc. */
RTK_HIDDEN void rtk_log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
RTK_HIDDEN void rtk_log_vline(const char *fmt, va_list ap);

#endif
