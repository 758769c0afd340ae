# test_staging_threads.py -- the staged input's threads hand batches over by notification, without TensorFlow.
import threading

from rtkit.scheduler.staging import ReadAhead


def _waits_end_only_on_notify(cond):
    """Make every wait of `cond` last until a notify: a hand-over left to a wait's timeout then never happens."""
    wait = cond.wait
    cond.wait = lambda timeout=None: wait()
    return lambda: setattr(cond, "wait", wait)


def test_a_finished_read_wakes_the_decode_waiting_for_it():
    """The Runner waits for the reader's batch in flight; the reader's end of the read must wake it. Left to the
    wait's 50 ms timeout, each latency-bound batch would wait up to 50 ms more, and read-ahead would lose to plain
    staging."""
    read_may_end, decoded, plain = threading.Event(), [], []
    ra = ReadAhead(run_read=lambda: read_may_end.wait(60), run_decode=lambda: decoded.append(1),
                   run_clear=lambda: None, depth=1)
    restore = _waits_end_only_on_notify(ra.cond)
    ra.on = True
    ra.start(1)
    stager = threading.Thread(target=ra.stage_next, args=(lambda: plain.append(1), True, lambda: False), daemon=True)
    stager.start()
    read_may_end.set()
    stager.join(60)    # a hang guard, not a time bound: woken by the notify, it ends at once
    hung = stager.is_alive()
    restore()          # the waits time out again; the reader, waiting for room in a wait that only a notify ends,
    ra.halt()          # is told to stop and woken
    with ra.cond:
        ra.cond.notify_all()
    ra.stop(30)
    assert not hung, "the decode waiting for the read in flight was never woken"
    assert decoded == [1] and plain == [], (decoded, plain)
