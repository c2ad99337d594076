"""`python -m engine presets`: list the gallery."""
from __future__ import annotations

import json

from ..gallery import presets


def add_parser(sub) -> None:
    p = sub.add_parser("presets", help="list the preset gallery")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=main)


def main(args) -> int:
    table = presets()
    if args.json:
        print(json.dumps([{"name": p.name, "family": p.family, "title": p.title, "cudnn": p.cudnn,
                           "citation": p.citation, "latex": p.latex} for p in table.values()], indent=2))
        return 0
    width = max(len(n) for n in table)
    print(f"{'name':<{width}}  {'family':<8}  {'cuDNN':<9}  title")
    for p in table.values():
        print(f"{p.name:<{width}}  {p.family:<8}  {p.cudnn or '-':<9}  {p.title}")
    return 0
