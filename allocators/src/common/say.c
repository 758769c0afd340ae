/* say.c -- bad-setting messages kept for a stats file, and the once-per-run claim on saying them. */
#include "common/say.h"

#include <errno.h>
#include <stdio.h>

#include "common/options.h"
#include "common/os.h"

void rtk_kept_begin(rtk_kept_t kept)
{
    int i = *kept.count < kept.cap ? *kept.count : kept.cap - 1;
    rtk_opt_set_error_sink(kept.slots + (size_t)i * kept.len, kept.len);
}

int rtk_kept_end(rtk_kept_t kept, int rc)
{
    rtk_opt_set_error_sink(NULL, 0);
    if (rc != 0 && *kept.count < kept.cap)
        (*kept.count)++;
    return rc;
}

int rtk_say_once(const char *run_dir, const char *marker)
{
    if (!run_dir || !run_dir[0])
        return 1;
    char path[4096 + 64];
    if (snprintf(path, sizeof path, "%s/%s", run_dir, marker) >= (int)sizeof path)
        return 1;
    return rtk_os_create_marker(path) != -EEXIST;
}
