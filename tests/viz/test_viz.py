"""What the chapters share (blink_edu.viz): the source listing is the file's own text, durations
read in the right unit, the state machine draws every move of the ring, and a chapter's server
starts, answers and leaves nothing behind."""

from __future__ import annotations

import inspect
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from blink_edu.ring import layout  # noqa: E402
from blink_edu.ring.layout import STATE_NAMES, TRANSITIONS, lock_path_for  # noqa: E402
from blink_edu.viz import states  # noqa: E402
from blink_edu.viz.server import ChapterServer, pid_alive  # noqa: E402
from blink_edu.viz.source import fmt_us, source_of  # noqa: E402


def test_source_of_is_the_files_text_decorators_included():
    text = source_of(layout, "lock_path_for")
    assert text == inspect.getsource(lock_path_for).rstrip("\n")
    assert text.startswith("def lock_path_for")
    with pytest.raises(ValueError, match="no function nope"):
        source_of(layout, "lock_path_for", "nope")


@pytest.mark.parametrize("us, text", [(None, "n/a"), (12.34, "12.3 µs"), (456.0, "456 µs"),
                                      (7890.0, "7.89 ms")])
def test_fmt_us_picks_the_unit(us, text):
    assert fmt_us(us) == text


@pytest.mark.parametrize("persistent", [False, True])
def test_the_state_machine_draws_every_move_and_state(persistent):
    ax = states.draw_state_machine(persistent=persistent)
    arrows = [a for a in ax.texts if getattr(a, "arrow_patch", None) is not None]
    assert len(arrows) == len(TRANSITIONS)
    dashed = [a for a in arrows if a.arrow_patch.get_linestyle() not in ("-", "solid")]
    expected = {(STATE_NAMES[s], STATE_NAMES[d]) for s, d in TRANSITIONS
                if STATE_NAMES[s] not in states.FRONTEND_STATES} - states.PERSISTENT_MOVES
    assert len(dashed) == (len(expected) if persistent else 0)
    shown = {t.get_text().replace("_\n", "_") for t in ax.texts}
    assert set(states.STATE_COLORS) <= shown
    matplotlib.pyplot.close("all")


def test_a_chapter_server_answers_and_leaves_nothing_behind():
    server = ChapterServer("--max-num-seqs", "2", "--ring-slots", "4", "--drain-timeout", "5")
    health = server.health()
    ring = health["ring"]["name"]
    assert health["status"] == "ready" and pid_alive(server.engine_pid)
    assert server.stop() == 0
    assert server.stop() == 0  # idempotent
    assert not pid_alive(server.engine_pid)
    assert not (Path("/dev/shm") / ring.lstrip("/")).exists()
    server.remove_log()
    assert not server.log_dir.exists()
