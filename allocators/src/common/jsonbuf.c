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

void rtk_out_str(rtk_out_t *o, const char *s)
{
    rtk_out_put(o, "\"");
    for (; s && *s && !o->full; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            rtk_out_put(o, "\\%c", c);
        else if (c < 0x20)
            rtk_out_put(o, "\\u%04x", c);
        else
            rtk_out_put(o, "%c", c);
    }
    rtk_out_put(o, "\"");
}
