"""Progress bars of long commands (aaa_django.management.progress): drawn on a terminal, nothing
anywhere else."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from aaa_django.management.progress import Progress
from aaa_django.models import EventRecord


class Terminal(io.StringIO):
    """What a command's stderr is on a terminal."""

    def isatty(self) -> bool:
        return True


def last_line(text: str) -> str:
    return text.rstrip("\n").split("\r")[-1].replace("\x1b[K", "")


def test_a_bar_on_a_terminal_ends_full_and_on_its_own_line():
    tty = Terminal()
    with Progress("copying", total=4, stream=tty, width=8, every=0) as bar:
        for _ in range(4):
            bar.advance()
    out = tty.getvalue()
    assert out.count("\r") == 6  # drawn at the start, at each step, at the end
    assert last_line(out) == "copying [########] 4/4 100%" and out.endswith("\n")
    assert "copying [####....] 2/4  50%" in out


def test_nothing_is_written_where_there_is_no_terminal():
    pipe = io.StringIO()
    with Progress("copying", total=4, stream=pipe, every=0) as bar:
        bar.advance(4)
    assert not bar.live and pipe.getvalue() == ""


@pytest.mark.django_db(transaction=True)
def test_the_demo_and_the_reindex_draw_on_a_terminal_only():
    tty, pipe = Terminal(), io.StringIO()
    call_command("aaa_demo", stdout=io.StringIO(), stderr=tty)
    events = EventRecord.objects.count()
    assert last_line(tty.getvalue()) == f"events {events}"  # counted as the run appended them

    tty = Terminal()
    call_command("aaa_reindex", stdout=io.StringIO(), stderr=tty)
    assert last_line(tty.getvalue()).startswith("re-indexing [") and last_line(tty.getvalue()).endswith("1/1 100%")

    call_command("aaa_demo", stdout=io.StringIO(), stderr=pipe)
    call_command("aaa_reindex", stdout=io.StringIO(), stderr=pipe)
    assert pipe.getvalue() == ""


@pytest.mark.django_db(transaction=True)
def test_the_sweep_counts_the_runs_it_re_drove_ending():
    from aaa_django.events import Event
    from aaa_django.runtime.event_types import RUN_STARTED, started_id
    from aaa_django.store import DjangoEventStore

    # a stalled run (nothing delivered its start) whose algorithm this process lacks:
    # re-driven, the engine ends it failed
    DjangoEventStore().append_sync(
        [
            Event(
                id=started_id("run-stalled"),
                stream="run-stalled",
                type=RUN_STARTED,
                data={"algorithm": "tests.nowhere", "input": {}},
            )
        ]
    )
    tty = Terminal()
    call_command("aaa_sweep", "--stall-after", "0", stdout=io.StringIO(), stderr=tty)
    assert last_line(tty.getvalue()).startswith("re-driven runs ended [")
    assert last_line(tty.getvalue()).endswith(" 1/1 100%")
