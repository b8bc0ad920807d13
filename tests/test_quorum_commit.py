"""A quorum queue's commit and election rules, as pure functions (no processes)."""
from haremq.cluster.mirroring.election import Position, choose
from haremq.cluster.mirroring.replicator import majority_upto

GROUP = ["hare1", "hare2", "hare3"]


def test_a_majority_of_three_is_the_master_and_one_whole_mirror():
    assert majority_upto(GROUP, {"hare2": 7, "hare3": 4}, own=9) == 7
    assert majority_upto(GROUP, {"hare3": 4}, own=9) == 4


def test_below_a_majority_nothing_is_committed():
    # hare3 down, hare2 restarted and still taking its snapshot (not whole): the master alone
    assert majority_upto(GROUP, {}, own=2000) == 0


def test_a_member_outside_the_group_never_counts():
    assert majority_upto(GROUP, {"hare4": 9}, own=9) == 0


def test_five_members_need_two_mirrors_and_a_lone_member_commits_alone():
    five = [*GROUP, "hare4", "hare5"]
    assert majority_upto(five, {"hare2": 8, "hare3": 3, "hare4": 6}, own=9) == 6
    assert majority_upto(five, {"hare2": 8}, own=9) == 0
    assert majority_upto(["hare1"], {}, own=5) == 5
    assert majority_upto(["hare1", "hare2"], {"hare2": 3}, own=5) == 3     # two members: both


def _at(node, seq, whole=True, epoch=1):
    return Position(node, f"inc-{node}", whole, epoch, seq)


def test_the_election_promotes_the_furthest_whole_copy_not_the_oldest_synchronised():
    # hare3 is the oldest synchronised, but hare2 counted for the newest confirms
    chosen = choose([_at("hare2", 90), _at("hare3", 70)], 3, 1, ["hare3", "hare2"], GROUP)
    assert chosen is not None and chosen.node == "hare2"


def test_no_election_without_a_majority_of_answers():
    assert choose([_at("hare2", 90), None], 3, 1, ["hare2"], GROUP) is None


def test_a_copy_being_synced_or_of_an_older_epoch_cannot_lead():
    assert choose([_at("hare2", 90, whole=False), _at("hare3", 10, epoch=0)], 3, 1, [], GROUP) is None
    chosen = choose([_at("hare2", 90, whole=False), _at("hare3", 10)], 3, 1, [], GROUP)
    assert chosen is not None and chosen.node == "hare3"


def test_ties_go_to_the_oldest_synchronised_member():
    chosen = choose([_at("hare2", 50), _at("hare3", 50)], 3, 1, ["hare3", "hare2"], GROUP)
    assert chosen is not None and chosen.node == "hare3"
