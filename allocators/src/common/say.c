/* say.c -- bad-setting messages kept for the stats files, and the once-per-run claim on saying them. */
#include "common/say.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/os.h"

#define KEPT_CAP 32
#define KEPT_LEN 320

static char g_kept[KEPT_CAP][KEPT_LEN];
static int g_kept_part[KEPT_CAP];
static int g_nkept;

void rtk_keep_message(int part, const char *msg)
{
    int i = g_nkept < KEPT_CAP ? g_nkept++ : KEPT_CAP - 1;
    snprintf(g_kept[i], sizeof g_kept[i], "%s", msg);
    g_kept_part[i] = part;
}

int rtk_kept_count(void) { return g_nkept; }

const char *rtk_kept_message(int i, int *part)
{
    if (part)
        *part = g_kept_part[i];
    return g_kept[i];
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

void rtk_say_kept(int from, const char *run_dir, const char *marker)
{
    if (from >= g_nkept || !rtk_say_once(run_dir, marker))
        return;
    for (int i = from; i < g_nkept; i++)
        rtk_log_line("%s", g_kept[i]);
}
