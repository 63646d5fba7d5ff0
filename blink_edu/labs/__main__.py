"""python -m blink_edu.labs {list | check N | handout OUT_DIR} — see ``blink_edu/labs/__init__.py``."""

from __future__ import annotations

import argparse
import sys

from . import LABS, solutions_available


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blink_edu.labs",
                                     description="The course labs: check your work, list tasks, "
                                                 "build the student handout.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the labs and their tasks")
    check = sub.add_parser("check", help="run lab N's tests, explain failures, print a score")
    check.add_argument("lab", type=int, choices=sorted(LABS))
    check.add_argument("-v", "--verbose", action="store_true",
                       help="also show pytest's own output (tracebacks)")
    check.add_argument("-k", dest="keyword", help="only the tests matching this pytest -k expression")
    check.add_argument("--solutions", action="store_true",
                       help="(instructors) check the reference solutions instead of your code")
    handout = sub.add_parser("handout", help="(instructors) write the student handout, without "
                                             "the reference solutions")
    handout.add_argument("out_dir")
    handout.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    args = parser.parse_args(argv)

    if args.command == "list":
        for lab in LABS.values():
            print(f"Lab {lab.number}: {lab.title}   (blink_edu/labs/{lab.module}.py, "
                  f"notebooks/labs/{lab.notebook})")
            for task, what in lab.tasks.items():
                print(f"    {task}  {what}")
        return 0
    if args.command == "check":
        from .grading import explain, run_check

        if args.solutions and not solutions_available():
            print("this copy has no reference solutions (it is a student handout)", file=sys.stderr)
            return 2
        report = run_check(args.lab, solutions=args.solutions, verbose=args.verbose,
                           keyword=args.keyword)
        explain(report)
        return 0 if len(report.passing_tasks()) == len(LABS[args.lab].tasks) else 1
    if args.command == "handout":
        from .handout import build_handout

        try:
            summary = build_handout(args.out_dir, force=args.force)
        except (ValueError, FileExistsError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(summary)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
