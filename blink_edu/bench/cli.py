"""What every benchmark's command line shares: its usage line, defaults in ``--help``, ``--out``.

Each benchmark is run as ``python -m blink_edu.bench.<name>``; ``--help`` prints that usage and
every option's default, and ``--out`` names the results folder (a scratch folder unless given:
``results.py``).
"""

from __future__ import annotations

import argparse

from .results import SCRATCH_DIR

OUT_HELP = (f"results folder (default: $BLINK_EDU_RESULTS_DIR or ./{SCRATCH_DIR}; publish with "
            f"--out bench/results)")


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default; an option whose default is None (decided later)
    or a plain switch says so in its own words instead of "(default: None)"."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def bench_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m blink_edu.bench.<name>``, described by ``doc``'s first
    paragraph, with ``--out``."""
    parser = argparse.ArgumentParser(prog=f"python -m blink_edu.bench.{name}",
                                     description=doc.split("\n\n")[0],
                                     formatter_class=DefaultsShown)
    parser.add_argument("--out", default=None, help=OUT_HELP)
    return parser
