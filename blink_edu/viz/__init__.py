"""What the chapters share: figures, source listings and a server to talk to.

Chapters import these instead of defining them again (docs/design.md §7):

* ``source`` -- ``show_source`` (a function of the package, exactly as in its file) and
  ``fmt_us`` (a duration written in the unit that reads best);
* ``fragments`` -- the m16n8k16 tensor-core instruction's fragment layout: which lane holds
  which element of A, B and C, and its drawing;
* ``states`` -- the ring's slot state machine (Blink §3) and its colours;
* ``server`` -- ``ChapterServer``: a real ``python -m blink_edu.serve`` in a child process that
  lives across a chapter's cells.

Figures are matplotlib; nothing here runs a kernel or touches the backend.
"""
