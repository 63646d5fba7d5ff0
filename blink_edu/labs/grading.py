"""``python -m blink_edu.labs check N``: run lab N's visible tests, explain, score.

Each test of ``tests/labs/test_labN.py`` carries ``@pytest.mark.task("N.k")`` (one or more). A
task *passes* when every test marked with it passes. A failure is explained in a student's words:

* the student's file does not import: the SyntaxError (with its line) or ImportError, named as
  such, and nothing else runs;
* a stub still raising ``NotImplementedError``: which TODO to write;
* anything else: what the check says (``labs/checks.py`` states numbers in words and names a known
  mistake when the output equals it), Hypothesis's failing example if it found one, and the hint
  below for that test.

``BLINK_EDU_LAB_SOLUTIONS`` is honoured as it is; ``solutions=True`` (``check --solutions``)
overrides it for the run.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from . import LABS, implementation, student_file, use_solutions

# test function name -> what to look at when it fails
HINTS: dict[str, str] = {
    # lab 1
    "test_inv_rms_matches_the_reference":
        "inv_rms must return 1/sqrt(mean of the squares of x[row, :] + eps): divide the sum of "
        "squares by the number of columns (x.shape[1]) before adding eps.",
    "test_inv_rms_of_a_zero_row_is_one_over_sqrt_eps":
        "Add eps inside the square root, after taking the mean: 1/sqrt(mean + eps).",
    "test_gemv_plain_matches_the_reference":
        "Without a norm and bias (both arrays have shape (0,)) out[r, o] is just the dot product "
        "of x[x_rows[r], :] with w[o, :]. Check how you split the thread index into (r, o), that "
        "threads with i >= R*O return, and that you read row x_rows[r] (not row r) of x.",
    "test_gemv_with_norm_bias_and_residual_matches_the_reference":
        "With a norm: multiply each x element by norm_w[i] and the whole dot product by inv_rms of "
        "the row. Add bias[o] when bias.shape[0] > 0, and with accumulate=1 add what out[r, o] "
        "held before (the residual) instead of overwriting it.",
    "test_gemv_reads_float16_weights":
        "The same plain GEMV with float16 weights: read each weight as float32(w[o, i]) and "
        "accumulate in float32.",
    "test_paged_attention_over_a_ragged_batch":
        "Each token attends to positions 0..positions[t] of ITS sequence (row seq_rows[t]); the "
        "key of position c is in block block_tables[row, c // B], slot c % B. Query head h uses "
        "kv head h // (H // K). Scale scores by 1/sqrt(E) and subtract the max before exp.",
    "test_paged_attention_is_causal_and_follows_the_block_table":
        "Walk only positions c <= positions[t] (the cache holds garbage after that), and find each "
        "position through the block table: blocks need not be consecutive or in order.",
    "test_engine_with_your_gemv_generates_the_reference_tokens":
        "Your GEMV passes the unit tests but the engine's tokens differ: every linear layer of the "
        "model runs through it (q/k/v with a norm, o-proj and down-proj with accumulate=1, the LM "
        "head on selected rows). Make sure all the unit tests of 1.1 and 1.2 pass first.",
    "test_engine_with_your_attention_generates_the_reference_tokens":
        "Your attention passes the unit tests but the engine's tokens differ: in the engine, "
        "padding tokens point at a scratch block; make sure you write every output element of your "
        "(t, h) and nothing else.",
    # lab 2
    "test_cas_moves_only_from_the_expected_state":
        "slot_cas must write `new` only when ring.state[slot] == expected, and return True exactly "
        "then; otherwise change nothing and return False.",
    "test_cas_rejects_every_move_the_state_machine_does_not_have":
        "Check (expected, new) against TRANSITIONS first and raise ValueError for a move that is "
        "not in it — before touching the state word.",
    "test_cas_reads_and_writes_the_state_under_the_lock":
        "Do the read AND the write of ring.state[slot] inside `with ring.lock():`.",
    "test_racing_frontends_reserve_each_slot_once":
        "Two threads raced for one slot and both won: the compare and the swap must happen under "
        "one ring.lock().",
    "test_the_ring_loop_serves_requests_through_your_cas":
        "The real frontend and engine loop move every slot through your slot_cas; make the unit "
        "tests of 2.1 pass first. A timeout means some move returned False when it should not.",
    "test_claim_takes_only_pending_slots":
        "claim_slot may only move PREFILL_PENDING -> PREFILL_PROCESSING; other states stay as "
        "they are, and it returns False for them.",
    "test_racing_threads_claim_each_slot_exactly_once":
        "A slot was claimed twice: use ONE cuda.atomic.cas(state, slot, PREFILL_PENDING, "
        "PREFILL_PROCESSING) and return True only if it returned PREFILL_PENDING.",
    "test_publish_writes_tokens_counter_state_and_reason":
        "Write output_tokens[slot, generated[slot]], then generated[slot] + 1; the first token "
        "moves the state to DECODE_PROCESSING; the last writes FINISH_LENGTH and then "
        "DECODE_COMPLETED.",
    "test_publish_order_token_before_counter_before_state":
        "Order matters: the token into the arena first, then the counter (store_release), then "
        "the state; on the last token the finish reason before DECODE_COMPLETED.",
    "test_the_polling_kernel_serves_frontend_threads":
        "The persistent polling kernel uses your claim_slot and publish_token while frontend "
        "threads submit and poll; make their unit tests pass first.",
    # lab 3
    "test_decodes_one_token_each_oldest_first_within_the_budget":
        "Walk ctx.running in order, ctx.run(seq, 1) for each decoding sequence, stop when the "
        "budget is 0, and return the budget left.",
    "test_decodes_skip_sequences_part_way_through_their_prompt":
        "Skip sequences whose seq.is_decoding is False: Lab 3.3 continues their prompts.",
    "test_decodes_preempt_the_newest_when_the_pool_is_full":
        "While not ctx.fits(seq, 1): victim = ctx.preempt_newest(). Walk ctx.running by index: "
        "it shrinks when you preempt.",
    "test_decodes_stop_when_a_sequence_must_preempt_itself":
        "If the victim of ctx.preempt_newest() is the sequence you are scheduling, stop the "
        "decodes altogether.",
    "test_prompt_chunk_is_limited_by_budget_and_memory":
        "chunk = min(seq.num_uncached_tokens, budget); return it if ctx.fits(seq, chunk), else 0.",
    "test_prompts_continue_the_partial_one_then_admit_fcfs_and_cut_the_last":
        "First the running sequences that are not decoding, then the waiting queue from the front: "
        "ctx.admit(seq) then ctx.run(seq, chunk), spending the budget as you go.",
    "test_prompts_do_not_overtake_one_that_does_not_fit":
        "When the front of the queue gets a chunk of 0, stop: nobody behind it may go first.",
    "test_prompts_respect_seats_and_admit_new":
        "Admit only while len(ctx.running) < ctx.max_num_seqs, and only if admit_new is True.",
    "test_engine_with_chunked_prefill_and_preemption_gives_the_reference_tokens":
        "LLMEngine runs your three functions every step; read the LabRuleBroken message if there "
        "is one, and make the unit tests of 3.1-3.3 pass first.",
    "test_engine_on_random_workloads_gives_the_reference_tokens":
        "Hypothesis found a workload (prompt lengths, budget, blocks, seats) where the engine goes "
        "wrong with your scheduler. Replay it by hand in the notebook.",
    # lab 4
    "test_blocks_become_synced_when_they_fill":
        "The full blocks are logical blocks old_tokens // B up to (not including) new_tokens // B; "
        "set states[table[i]] = SYNCED for them and return table[i] in order.",
    "test_synced_blocks_are_exactly_the_full_ones":
        "Report each block once, in the step where it fills; a block filled earlier is not "
        "reported again, the partly filled tail stays DIRTY.",
    "test_written_blocks_go_stale_and_filled_ones_queue_for_copy_out":
        "Touched blocks: old_tokens // B up to ceil(new_tokens / B) (remove them from mirrored); "
        "filled ones: old_tokens // B up to new_tokens // B (add them to pending_out).",
    "test_a_prompt_filling_blocks_exactly_queues_them_all":
        "When new_tokens is a multiple of B the last touched block is full too.",
    "test_rotate_out_moves_what_has_no_current_host_copy":
        "Return [i for i in range(num_blocks) if i not in mirrored].",
    "test_plan_merges_consecutive_host_blocks":
        "Sort the (host, gpu) pairs by host block; start a new run whenever a host block is not "
        "the previous one + 1. Each run is (first host block, [its gpu blocks]).",
    "test_plan_copies_every_pair_once_in_the_fewest_copies":
        "Every (gpu, host) pair must be copied exactly once, and consecutive host blocks must be "
        "merged into one run.",
    "test_rotation_under_memory_pressure_keeps_the_reference_tokens":
        "The engine rotates requests out and in with your books and plan. Wrong tokens: a stale "
        "host copy was trusted (4.2) or bytes went to the wrong block (4.4). 'at most the dirty "
        "tail': eager copy-out is not queued (4.2) or rotate-out moves too much (4.3).",
    # lab 5
    "test_vlt_of_each_state_by_hand":
        "RUNNING: -(now - run_start_time); WAITING: max(0, now - arrival - beta_f * ttft_slo); "
        "ROTARY: alpha * max(0, now - last_token_time - beta_b * tbt_slo), with the arrival time "
        "when last_token_time is NaN.",
    "test_vlt_equals_the_projects_formula":
        "Hypothesis found requests where your VLT differs from the formula: work the example out "
        "by hand, state by state.",
    "test_rank_largest_lag_first_ties_in_fcfs_order":
        "sorted(view.requests, key=lambda r: -vlt(r, view.now, config)) keeps ties in order.",
    "test_enough_memory_means_plain_fcfs":
        "If every candidate's blocks_to_run plus the running ones' growth fit the free blocks and "
        "the seats suffice: admit all candidates in view order, fcfs_fallback=True.",
    "test_under_pressure_admit_the_most_lagging_and_rotate_out_the_longest_running":
        "Admit from the head of the ranking while capacity lasts; preempt running requests from "
        "the tail until the deficit is <= 0. Put the VLTs in Decision.vlt.",
    "test_decisions_equal_the_projects_lvf_on_random_steps":
        "Hypothesis found a step where your decision differs: check the capacity (min of the two "
        "bounds), the stop at the first candidate that does not fit, and the seats rule at the "
        "end.",
    "test_your_policy_drives_the_simulator_like_the_projects_lvf":
        "In the simulator your policy made a different decision at some step; the unit tests of "
        "5.1-5.3 are the quickest way to find out why.",
}


@dataclass
class TestResult:
    nodeid: str
    tasks: tuple
    outcome: str = "not run"  # passed | failed | error | skipped | not run (deselected)
    message: str = ""  # what failed, in words (the check's own message)
    not_implemented: str = ""  # "Lab N.k: ..." when a stub raised
    example: str = ""  # Hypothesis's falsifying example, when it found one
    kind: str = ""  # the exception's class name: AssertionError, LabCheckFailed, TypeError, ...

    @property
    def function(self) -> str:
        return self.nodeid.split("::")[-1].split("[")[0]


@dataclass
class Report:
    lab: int
    results: list = field(default_factory=list)
    collect_errors: list = field(default_factory=list)  # the test file itself did not load
    module_error: str = ""  # the student's file does not import (nothing could run)
    task: str | None = None  # only this task was checked

    def tasks(self) -> dict[str, list[TestResult]]:
        """{task: its tests that ran} (every task of the lab; an unchecked one has none)."""
        out = {task: [] for task in LABS[self.lab].tasks}
        for r in self.results:
            for t in r.tasks:
                if self.task in (None, t):
                    out.setdefault(t, []).append(r)
        return out

    def passing_tasks(self) -> list[str]:
        return [t for t, rs in self.tasks().items() if rs and all(r.outcome == "passed" for r in rs)]


_EXCEPTION_PREFIX = re.compile(r"^(?:[\w.]+\.)?(?:AssertionError|LabCheckFailed|LabRuleBroken): ")
# Hypothesis's note naming the inputs that failed (its wording differs between versions)
_EXAMPLE = re.compile(r"^(?:Falsifying example|Failing test case): .*?^\)$", re.S | re.M)
_ARGUMENT = re.compile(r"^    (\w+)=")


def compact_example(example: str, max_lines: int = 3) -> str:
    """Hypothesis's example with every argument longer than ``max_lines`` lines (a fixture such
    as a model's weights) shortened to ``name=...``."""
    blocks: list[list[str]] = []
    for line in example.splitlines():
        if _ARGUMENT.match(line) or not blocks or not line.startswith("     "):
            blocks.append([line])
        else:
            blocks[-1].append(line)
    out = []
    for block in blocks:
        found = _ARGUMENT.match(block[0])
        out += [f"    {found.group(1)}=...,"] if found and len(block) > max_lines else block
    return "\n".join(out)


def split_example(crash_message: str) -> tuple[str, str]:
    """(the failure, Hypothesis's "Falsifying example: ..." note or "")."""
    found = _EXAMPLE.search(crash_message)
    if not found:
        return crash_message, ""
    return (crash_message[:found.start()] + crash_message[found.end():],
            compact_example(found.group(0)))


def failure_message(crash_message: str) -> str:
    """The failed check in words: the assertion's own message without the exception's name, or
    (a bare ``assert``) the condition that did not hold — never pytest's introspection lines."""
    crash_message, _ = split_example(crash_message)
    lines = [line.rstrip() for line in crash_message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    first = _EXCEPTION_PREFIX.sub("", lines[0])
    if first.startswith("assert "):  # a bare assert: no message of its own
        return f"this check did not hold: {first}"
    kept = [first]
    for line in lines[1:]:
        if line.lstrip().startswith(("assert ", "Explanation:", "Draw ")):  # pytest's, Hypothesis's
            break
        kept.append(line.strip())
    return " ".join(kept)


def exception_kind(crash_message: str) -> str:
    """The class name of the exception a failure reports ("AssertionError" for a bare assert)."""
    first = crash_message.strip().split("\n", 1)[0]
    if first.startswith("assert "):
        return "AssertionError"
    found = re.match(r"^([\w.]+): ", first) or re.match(r"^([\w.]+)$", first)
    return found.group(1).rsplit(".", 1)[-1] if found else ""


class _Collector:
    """A pytest plugin that keeps each test's tasks and outcome (only ``task``'s tests when one
    is given)."""

    def __init__(self, task: str | None = None):
        self.task = task
        self.by_id: dict[str, TestResult] = {}
        self.collect_errors: list[str] = []

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(str(report.longrepr))

    def pytest_collection_modifyitems(self, config, items):
        keep, drop = [], []
        for item in items:
            tasks = tuple(sorted({m.args[0] for m in item.iter_markers("task")}))
            (keep if self.task is None or self.task in tasks else drop).append(item)
            self.by_id[item.nodeid] = TestResult(item.nodeid, tasks)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_runtest_logreport(self, report):
        r = self.by_id.get(report.nodeid)
        if r is None or r.outcome in ("failed", "error"):
            return
        if report.passed and report.when == "call":
            r.outcome = "passed"
        elif report.failed:
            r.outcome = "failed" if report.when == "call" else "error"
            text = str(report.longrepr)
            crash = getattr(report.longrepr, "reprcrash", None)
            crashed = crash.message if crash is not None else text[-400:]
            r.message, r.kind = failure_message(crashed), exception_kind(crashed)
            found = re.search(r"NotImplementedError: (Lab \d+\.\d+[^\n]*)", text)
            if found:
                r.not_implemented = found.group(1)
            r.example = split_example(crashed)[1] or split_example(text)[1]
        elif report.skipped and report.when in ("setup", "call"):
            r.outcome = "skipped"


def find_tests(lab: int) -> Path:
    """tests/labs/test_labN.py: under the current folder's repository, or beside the package."""
    name = Path("tests") / "labs" / f"test_lab{lab}.py"
    here = Path.cwd().resolve()
    for folder in (here, *here.parents, Path(__file__).resolve().parents[2]):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"no {name} here or above {here}: run this from your copy of the "
                            f"repository (the labs' tests live there, not in the installed "
                            f"package)")


def module_error(lab: int) -> str:
    """"" if lab ``lab``'s module imports; else what is wrong with it, named as such (a
    SyntaxError with its line, an ImportError, anything raised while importing)."""
    try:
        implementation(lab)
    except SyntaxError as err:
        where = Path(err.filename or student_file(lab)).name
        text = (err.text or "").rstrip("\n")
        caret = " " * max((err.offset or 1) - 1 - (len(text) - len(text.lstrip())), 0) + "^"
        shown = f"\n    {text.strip()}\n    {caret}" if text.strip() else ""
        return (f"{where} has a {type(err).__name__} on line {err.lineno}: {err.msg}{shown}\n"
                f"Python cannot even read the file, so none of the lab's tests can run: fix "
                f"this line first.")
    except ImportError as err:
        return (f"{student_file(lab)} does not import: {type(err).__name__}: {err}"
                f"{_line_in(err, lab)}\nNone of the lab's tests can run until it imports.")
    except Exception as err:  # noqa: BLE001 - anything at import time: show it, score 0
        return (f"{student_file(lab)} raises {type(err).__name__} while being imported: "
                f"{err}{_line_in(err, lab)}\nCode at the top level of the file runs on import: "
                f"keep your code inside the functions.")
    return ""


def _line_in(err: BaseException, lab: int) -> str:
    """" (line N)" of the innermost frame in the lab's module, if any."""
    import traceback

    name = f"{LABS[lab].module}.py"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename.endswith(name)]
    return f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""


def run_check(lab: int, solutions: bool | None = None, verbose: bool = False,
              keyword: str | None = None, task: str | None = None,
              exitfirst: bool = False) -> Report:
    """Run lab ``lab``'s tests in this process and collect what passed. ``solutions``: True or
    False to check the reference solutions or the student's code; None (default) leaves the
    choice to ``BLINK_EDU_LAB_SOLUTIONS`` (and :func:`blink_edu.labs.substituted`). ``task``:
    only the tests of that task; ``exitfirst``: stop at the first failure."""
    import pytest

    if lab not in LABS:
        raise SystemExit(f"there is no lab {lab}; labs: {', '.join(map(str, LABS))}")
    if task is not None and task not in LABS[lab].tasks:
        raise SystemExit(f"lab {lab} has no task {task}; its tasks: {', '.join(LABS[lab].tasks)}")
    with _choosing(solutions):
        error = module_error(lab)
        if error:
            return Report(lab, module_error=error, task=task)
        path = find_tests(lab)
        args = [str(path), "-p", "no:cacheprovider", "-o", "console_output_style=classic"]
        args += ["-q", "--tb=short"] + (["-x"] if exitfirst else [])
        if keyword:
            args += ["-k", keyword]
        collector = _Collector(task)
        output = io.StringIO()
        with contextlib.redirect_stdout(output):  # pytest's own report: shown with --verbose
            pytest.main(args, plugins=[collector])
    if verbose:
        print(output.getvalue())
    ran = [r for r in collector.by_id.values() if r.outcome != "not run"]
    return Report(lab, ran, collector.collect_errors, task=task)


@contextlib.contextmanager
def _choosing(solutions: bool | None):
    """``use_solutions(solutions)`` for the block, then whatever was chosen before."""
    if solutions is None:
        yield
        return
    before = use_solutions(solutions)
    try:
        yield
    finally:
        use_solutions(before)


def explain(report: Report, out=None) -> None:
    lab = LABS[report.lab]
    w = (out or sys.stdout).write
    w(f"\nLab {lab.number}: {lab.title}\n")
    if report.module_error:
        w("\n" + textwrap.indent(report.module_error, "  ") + "\n")
    for error in report.collect_errors:
        w("\n  The lab's test file could not be loaded:\n")
        w(textwrap.indent(error.strip()[-1500:], "    ") + "\n")
    tasks = report.tasks()
    for task, description in lab.tasks.items():
        results = tasks.get(task, [])
        ok = results and all(r.outcome == "passed" for r in results)
        passed = sum(r.outcome == "passed" for r in results)
        if not results and not report.module_error:
            w(f"\n  [----] Task {task} — not checked this time\n")
            continue
        mark = "PASS" if ok else "FAIL"
        w(f"\n  [{mark}] Task {task} — {description}  ({passed}/{len(results)} tests)\n")
        if ok or not results:
            continue
        own = [r.not_implemented for r in results
               if r.not_implemented.startswith(f"Lab {task}:")]
        stub = own[0] if own else ""
        if stub and all(r.outcome != "passed" for r in results):
            w(f"         Not written yet: {stub.split(' is still')[0]}. Open "
              f"{student_file(lab.number)}, find '# TODO: Lab {task}', replace the "
              f"`raise NotImplementedError` with your code.\n")
            continue
        for r in results:
            if r.outcome == "passed":
                continue
            w(f"         - {r.function}: {r.outcome}\n")
            if r.not_implemented:
                w(f"           needs another task first: "
                  f"{r.not_implemented.split(' is still')[0]}\n")
                continue
            if r.message:
                w(textwrap.fill(r.message[:1200], 92, initial_indent="           what: ",
                                subsequent_indent="                 ") + "\n")
            if r.example:
                w(textwrap.indent(r.example, "           | ") + "\n")
            hint = HINTS.get(r.function)
            if hint:
                w(textwrap.fill(hint, 92, initial_indent="           hint: ",
                                subsequent_indent="                 ") + "\n")
    n_tasks = 1 if report.task else len(lab.tasks)
    passing = len(report.passing_tasks())
    tests_ok = sum(r.outcome == "passed" for r in report.results)
    w(f"\nScore: {passing}/{n_tasks} tasks passing ({tests_ok}/{len(report.results)} tests)\n")
    if passing < n_tasks and not report.module_error:
        w(f"Details: python -m blink_edu.labs check {lab.number} --verbose\n")
