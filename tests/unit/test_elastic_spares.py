"""Rank 0's bookkeeping of warm spares (hvdlite.elastic.spares) and a spare's command line, in process;
spares started, admitted and dismissed by real ranks are in tests/multirank/test_elastic_spares.py."""

import sys
import types

from hvdlite.elastic.spares import Spare, Spares, spare_argv


def _spares(*spares, exited=()):
    book = Spares()
    book.waiting = list(spares)
    book.exited = lambda ids: {process_id for process_id in ids if process_id in exited}
    return book


def test_a_spare_that_exits_while_it_waits_is_replaced_but_one_that_never_got_ready_stops_the_spares():
    waited, starting = Spare("a", "g1.0", ready=True), Spare("a", "g2.0")
    book = _spares(waited, starting, exited={"g1.0"})
    book.forget_gone(now=True)
    assert book.waiting == [starting] and not book.given_up
    book.exited = lambda ids: set(ids)
    book.forget_gone(now=True)
    assert book.waiting == [] and book.given_up


def test_a_failed_spawn_is_abandoned_and_tried_again_three_times_then_the_spares_stop():
    book, abandoned = _spares(), []
    book.abandon = abandoned.append
    for attempt in range(4):
        book.waiting = [Spare("a", f"g{attempt}.0", failed=RuntimeError("PMI_Spawn_multiple returned -1"))]
        book.forget_gone(now=True)
        assert book.waiting == [] and book.given_up == (attempt == 3)
    assert abandoned == ["g0.0", "g1.0", "g2.0"]  # a process the failed spawn started ends itself


def test_spares_set_aside_for_a_plan_that_never_ran_wait_again():
    first, second, other = Spare("a", "g1.0", ready=True), Spare("a", "g2.0", ready=True), Spare("b", "g3.0", ready=True)
    book = _spares(first, second, other)
    assert book.count(ready=True) == {"a": 2, "b": 1} and book.count(ready=False) == {}
    book.choose({"a": 1})
    assert book.admitting == [first] and book.waiting == [second, other]
    book.forget_gone(now=True)  # the next commit's plan: the first plan was not applied (a rank died)
    assert book.admitting == [] and set(map(id, book.waiting)) == {id(first), id(second), id(other)}
    book.choose({"b": 1})
    assert book.take_admitting() == [other] and book.admitting == []


def test_a_spare_runs_the_same_script_or_module_with_the_same_options_through_spare_start(monkeypatch, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setattr(sys, "orig_argv", ["python", "-u", "-X", "dev", str(script), "--lr", "1"])
    monkeypatch.setattr(sys, "argv", [str(script), "--lr", "1"])
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
    argv = spare_argv()
    assert argv[:3] == ["-u", "-X", "dev"] and argv[3].endswith("hvdlite/elastic/spare_start.py")
    assert argv[4:] == ["path", str(script), "--lr", "1"]
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "trainer.main", "--lr", "1"])
    monkeypatch.setattr(sys, "argv", ["/src/trainer/main.py", "--lr", "1"])
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=types.SimpleNamespace(name="trainer.main")))
    assert spare_argv()[1:] == ["module", "trainer.main", "--lr", "1"]
    monkeypatch.setattr(sys, "orig_argv", ["python", "-c", "print(1)"])
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
    assert spare_argv() is None


def test_the_admission_log_names_warm_spares_and_new_ranks_apart():
    from hvdlite.elastic.joining import admitted_kinds

    warm, new = Spare("hostA", "g1.0"), Spare("hostB", "g2.0", deferred=True)
    assert admitted_kinds([warm]) == "1 warm spare(s)"
    assert admitted_kinds([new, new]) == "2 new rank(s)"
    assert admitted_kinds([warm, new, new]) == "1 warm spare(s) and 2 new rank(s)"
