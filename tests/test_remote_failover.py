"""The remote queue's failover watch as a pure machine: no sockets, no loop, the time given."""
from haremq.cluster.links.failover import BLIP, PARK_TIMEOUT, Act, Action, FailoverWatch, Phase


def acts(actions):
    return [a.act for a in actions]


def test_a_serving_master_needs_no_ticks():
    watch = FailoverWatch()
    assert not watch.failing
    assert not watch.waiting()
    assert watch.tick(5.0, master_up=True, can_fail_over=True) == []


def test_a_broken_stream_starts_one_failing_spell():
    watch = FailoverWatch()
    assert watch.broke(10.0) is True          # tell the membership once
    assert watch.broke(10.5) is False         # a second broken link in the same spell
    assert watch.failing and watch.waiting()
    assert watch.failing_since == 10.0


def test_a_blip_ends_with_one_resume_once_the_master_answers_after_it():
    watch = FailoverWatch()
    watch.broke(10.0)
    assert watch.tick(10.0 + BLIP / 2, master_up=True, can_fail_over=True) == []    # too soon to trust it
    assert watch.failing
    assert watch.tick(10.0 + BLIP + 0.1, master_up=False, can_fail_over=True) == []  # still down
    assert acts(watch.tick(10.0 + BLIP + 0.3, master_up=True, can_fail_over=True)) == [Act.RESUME]
    assert watch.phase is Phase.SERVING and not watch.failing
    assert watch.tick(10.0 + BLIP + 0.5, master_up=True, can_fail_over=True) == []


def test_new_calls_wait_until_the_tick_that_resumes():
    """The query never ends a spell by itself: a publish made between the master coming back
    and the tick is held behind the older ones, so the tick sends them in order."""
    watch = FailoverWatch()
    watch.broke(0.0)
    watch.holding(0.1)
    assert watch.failing                       # at 5 s, master up, no tick yet: still waiting
    assert acts(watch.tick(5.0, master_up=True, can_fail_over=True)) == [Act.RESUME]


def test_a_failover_ends_the_spell_without_a_resume():
    watch = FailoverWatch()
    watch.broke(0.0)
    watch.holding(0.0)
    watch.moved()
    watch.released()           # the queue carried what it held to the new master
    assert not watch.failing and not watch.waiting()
    assert watch.tick(20.0, master_up=False, can_fail_over=False) == []


def test_held_publishes_are_nacked_when_no_master_comes_in_time():
    watch = FailoverWatch()
    watch.broke(0.0)
    watch.holding(0.5)
    assert watch.tick(0.5 + PARK_TIMEOUT - 0.1, master_up=False, can_fail_over=True) == []
    assert acts(watch.tick(0.5 + PARK_TIMEOUT + 0.1, master_up=False, can_fail_over=True)) == [Act.NACK_HELD]
    watch.released()
    assert watch.failing          # the spell goes on: later publishes wait again


def test_held_publishes_are_nacked_after_a_blip_when_no_mirror_can_take_over():
    """A broken stream is not yet a dead master: what a blip holds goes to it if it answers,
    even when the blip also broke the mirrors' streams (none in sync, none can take over)."""
    watch = FailoverWatch()
    watch.broke(0.0)
    watch.holding(0.0)
    assert watch.tick(0.2, master_up=False, can_fail_over=False) == []
    assert acts(watch.tick(BLIP + 0.2, master_up=False, can_fail_over=False)) == [Act.NACK_HELD]


def test_a_blip_that_broke_the_mirrors_streams_too_resumes_with_the_master():
    watch = FailoverWatch()
    watch.broke(0.0)
    watch.holding(0.0)
    assert watch.tick(0.4, master_up=True, can_fail_over=False) == []
    assert acts(watch.tick(BLIP + 0.2, master_up=True, can_fail_over=False)) == [Act.RESUME]


def test_the_oldest_held_publish_sets_the_time_out():
    watch = FailoverWatch()
    watch.broke(0.0)
    watch.holding(1.0)
    watch.holding(8.0)
    assert watch.held_since == 1.0
    watch.released()
    watch.holding(9.0)
    assert watch.held_since == 9.0


def test_held_while_serving_are_flushed_on_the_next_tick():
    watch = FailoverWatch()
    watch.holding(0.0)
    assert acts(watch.tick(0.2, master_up=True, can_fail_over=True)) == [Act.FLUSH_HELD]


def test_parked_calls_replay_when_the_master_is_up_and_give_up_at_their_deadline():
    watch = FailoverWatch()
    watch.broke(0.0)
    first = watch.park(0.0, timeout=3.0)
    second = watch.park(1.0)
    assert first != second
    assert watch.tick(2.0, master_up=False, can_fail_over=True) == []
    assert watch.tick(3.0, master_up=False, can_fail_over=True) == [Action(Act.GIVE_UP, first)]
    watch.unpark(first)
    assert watch.tick(1.0 + PARK_TIMEOUT, master_up=False, can_fail_over=True) == [Action(Act.GIVE_UP, second)]


def test_parked_calls_on_a_serving_master_replay_when_it_is_up():
    watch = FailoverWatch()
    token = watch.park(0.0)
    assert watch.waiting()
    assert watch.tick(0.2, master_up=False, can_fail_over=True) == []
    assert acts(watch.tick(0.4, master_up=True, can_fail_over=True)) == [Act.REPLAY_PARKED]
    watch.unpark(token)
    assert not watch.waiting()


def test_a_negative_time_out_gives_up_on_the_first_tick():
    watch = FailoverWatch()
    token = watch.park(5.0, timeout=-1.0)
    assert watch.tick(5.0, master_up=False, can_fail_over=True) == [Action(Act.GIVE_UP, token)]
