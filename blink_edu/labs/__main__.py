"""python -m blink_edu.labs {list | check N | handout OUT_DIR} — see ``blink_edu/labs/__init__.py``."""

from __future__ import annotations

import argparse
import sys

from . import ENV_VAR, LABS, solutions_available, solutions_enabled


def main(argv=None) -> int:
    defaults = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m blink_edu.labs", formatter_class=defaults,
                                     description="The course labs: check your work, list tasks, "
                                                 "build the student handout.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the labs and their tasks", formatter_class=defaults)
    check = sub.add_parser("check", help="run lab N's tests, explain failures, print a score",
                           formatter_class=defaults)
    check.add_argument("lab", type=int, choices=sorted(LABS), help="the lab's number")
    check.add_argument("-v", "--verbose", action="store_true",
                       help="also show pytest's own output (tracebacks)")
    check.add_argument("-k", dest="keyword", default=None,
                       help="only the tests matching this pytest -k expression")
    check.add_argument("--task", default=None, help="only the tests of this task, e.g. 1.3")
    check.add_argument("--solutions", action="store_true",
                       help=f"(instructors) check the reference solutions instead of your code; "
                            f"{ENV_VAR}=1 in the environment does the same")
    handout = sub.add_parser("handout", help="(instructors) write the student handout, without "
                                             "the reference solutions; run it from a clone of "
                                             "the repository", formatter_class=defaults)
    handout.add_argument("out_dir", help="the folder to write (outside the repository)")
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

        if (args.solutions or solutions_enabled()) and not solutions_available():
            print("this copy has no reference solutions (it is a student handout): drop "
                  f"--solutions and unset {ENV_VAR} to check your code", file=sys.stderr)
            return 2
        try:
            report = run_check(args.lab, solutions=True if args.solutions else None,
                               verbose=args.verbose, keyword=args.keyword, task=args.task)
        except FileNotFoundError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        solutions = args.solutions or solutions_enabled()
        print(f"(checking {'the reference solutions' if solutions else 'your code'})")
        explain(report)
        wanted = [args.task] if args.task else list(LABS[args.lab].tasks)
        return 0 if report.passing_tasks() == wanted else 1
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
