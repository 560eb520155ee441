from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from fleetctl.traffic.split import apportion, drained, drained_within, parse_percentages


def test_percentages_become_basis_points_and_zeros_drop_out():
    assert parse_percentages({"a": 99.9, "b": "0.1", "c": 0}) == {"a": 9990, "b": 10}


@pytest.mark.parametrize(("raw", "message"), [
    ({"a": -1, "b": 101}, "outside 0–100"),
    ({"a": "ten"}, "not a number"),
    ({"a": True}, "not a number"),
    ({"a": 50, "b": 40}, "add up to 90"),
    ({"a": 0, "b": 0}, "All weights are zero"),
    ({"a": 99.995, "b": 0.005}, "finer than the 0.01 % step"),
    ({}, "Give weights"),
    ([50, 50], "Give weights"),
    ({"a": "NaN"}, "outside 0–100"),
])
def test_bad_weights_are_refused_with_a_reason(raw, message):
    with pytest.raises(ValidationError) as caught:
        parse_percentages(raw)
    assert message in str(caught.value.message_dict["weights"])


def test_draining_a_candidate_gives_its_share_to_the_primary():
    split = {"primary": 9000, "cand": 1000}
    assert drained(split, remove={"cand"}, primary="primary",
                   eligible={"primary", "cand"}) == {"primary": 10000}


def test_draining_the_primary_spreads_over_the_remaining_eligible_pools():
    split = {"primary": 5000, "b": 3000, "c": 2000}
    result = drained(split, remove={"primary"}, primary="primary",
                     eligible={"primary", "b", "c"})
    assert result == {"b": 6000, "c": 4000}
    assert sum(result.values()) == 10000


def test_with_no_eligible_pool_left_the_split_is_empty_and_never_crosses_a_border():
    split = {"eu-pool": 10000}
    # The primary is abroad (not eligible for the pinned route): nowhere to go.
    assert drained(split, remove={"eu-pool"}, primary="us-primary",
                   eligible={"eu-pool"}) == {}


def test_a_pool_outside_the_jurisdiction_is_dropped_not_given_more():
    split = {"eu-a": 6000, "us-b": 4000}
    assert drained(split, remove={"eu-a"}, primary="eu-c",
                   eligible={"eu-a", "eu-c"}) == {"eu-c": 10000}


def test_uneven_shares_still_sum_to_exactly_100_percent():
    result = drained({"a": 3333, "b": 3333, "c": 3334}, remove={"c"}, primary="c",
                     eligible={"a", "b", "c"})
    assert sum(result.values()) == 10000


# --- a drain within the pools' capacity (drain_capacity.py decides the room) ---

SPLIT = {"p": 4000, "s": 2000, "d": 3000, "x": 1000}
ALL = {"p", "s", "d", "x"}


def test_within_room_the_primary_takes_what_fits_and_the_rest_spreads_by_room():
    # 30 % carries 6 streams (5 % each): p has room for 2, s for 8.
    after, given = drained_within(SPLIT, remove={"d"}, primary="p", eligible=ALL, load=6,
                                  room={"p": 2, "s": 8}, capacity={"p": 10, "s": 10},
                                  at_least=3000)
    assert after == {"p": 5000, "s": 4000, "x": 1000}
    assert given == {"p": 1000, "s": 2000}


def test_what_does_not_fit_stays_on_the_drained_pool_beyond_the_least_that_moves():
    after, given = drained_within(SPLIT, remove={"d"}, primary="p", eligible=ALL, load=6,
                                  room={"p": 1, "s": 0}, capacity={"p": 8, "s": 2},
                                  at_least=750)
    # 1 stream fits (5 %); 7.5 % must move: the extra 2.5 % by capacity, 8:2.
    assert after == {"p": 4500 + 200, "s": 2050, "d": 2250, "x": 1000}
    assert sum(after.values()) == 10_000
    assert given == {"p": 700, "s": 50}


def test_asked_for_everything_the_drained_pool_keeps_nothing():
    after, _ = drained_within(SPLIT, remove={"d"}, primary="p", eligible=ALL, load=60,
                              room={"p": 1, "s": 1}, capacity={"p": 3, "s": 1},
                              at_least=3000)
    assert "d" not in after and sum(after.values()) == 10_000
    assert after["x"] == 1000


def test_apportion_sums_exactly():
    assert apportion({"a": 1.0, "b": 1.0, "c": 1.0}, 100) == {"a": 33, "b": 33, "c": 34}
    assert apportion({"a": 0.0}, 100) == {}
