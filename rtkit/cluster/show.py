# show.py -- what `rtkit report` and `rtkit compare` do when given cluster folders instead of run directories.
from __future__ import annotations

import json
import sys

from rtkit.cluster import merge, render
from rtkit.errors import UserError


def report(args) -> int:
    m = merge.merge(args.run_dir)
    if not m["tasks"]:
        raise UserError(f"rtkit: '{args.run_dir}' has no task run directories yet (task.json or report.json with a "
                        f"cluster section)")
    if args.json:
        json.dump(m, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.html is not None:
        from rtkit.report import html
        print(html.write_for_user(render.write_html, m, args.html or render.default_html_path(args.run_dir)))
    else:
        from rtkit.report import terminal
        sys.stdout.write(render.render_text(m, width=max(terminal.width_for(sys.stdout, args.width), 130)))
    return 0


def compare(args) -> int:
    c = render.compare(merge.merge(args.run_a), merge.merge(args.run_b))
    if args.json:
        json.dump(c, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render.render_compare(c))
    return 0
