/* jsonbuf.c -- bounded text buffer for the JSON statistics files, written without malloc. */
#include "common/jsonbuf.h"

#include <stdarg.h>
#include <stdio.h>

void rtk_out_put(rtk_out_t *o, const char *fmt, ...)
{
    if (o->full)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->off, o->cap - o->off, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->off)
        o->full = 1;
    else
        o->off += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes there are not one. */
static int utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || (n == 2 && c < 0xc2) || (n == 4 && c > 0xf4))
        return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if (n == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0)))
        return 0;  /* overlong or a surrogate */
    if (n == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90)))
        return 0;
    return n;
}

/* Paths and plan text come from the user and may hold any bytes: a byte that is not valid UTF-8 becomes U+FFFD,
 * so the file stays valid JSON whatever the input (docs/safety.md). */
void rtk_out_str(rtk_out_t *o, const char *s)
{
    rtk_out_put(o, "\"");
    const unsigned char *p = (const unsigned char *)s;
    while (p && *p && !o->full) {
        unsigned char c = *p;
        int n = utf8_len(p);
        if (n == 0) {
            rtk_out_put(o, "\\ufffd");
            p++;
        } else if (c == '"' || c == '\\') {
            rtk_out_put(o, "\\%c", c);
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            rtk_out_put(o, "\\u%04x", c);
            p++;
        } else {
            rtk_out_put(o, "%.*s", n, (const char *)p);
            p += n;
        }
    }
    rtk_out_put(o, "\"");
}
