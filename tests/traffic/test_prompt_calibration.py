"""The prompt-size calibration: fitted from the conformance probe's recorded
usage.prompt_tokens, the most conservative per model in the Lua script, the default where no
run is recorded. (The estimate itself, through a real Envoy: envoy/test_prompt_size.py.)"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleetctl.conformance.calibration import fit, pool_calibrations
from fleetctl.conformance.cases.probe import PARITY_MESSAGES
from fleetctl.conformance.models import ConformanceCase, ConformanceRun
from fleetctl.sim.textgen import render_chat, render_chat_other, tokenize, tokenize_other
from fleetctl.traffic.gateways.base import DesiredState, PoolTarget, PromptCalibration, RouteSpec
from fleetctl.traffic.gateways.envoy.lua import model_calibrations, routing_lua
from fleetctl.traffic.gateways.envoy.validate import ConfigError, validate
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture


def counts(tokenizer: str) -> list[int]:
    """usage.prompt_tokens of the parity sets as the simulator counts them (+1: BOS)."""
    tok, chat = (tokenize, render_chat) if tokenizer == "llama3" else (tokenize_other,
                                                                        render_chat_other)
    return [len(tok(chat([(m["role"], m["content"]) for m in ms]))) + 1
            for ms in PARITY_MESSAGES]


def test_the_fit_reproduces_the_counts_it_came_from() -> None:
    for tokenizer in ("llama3", "other"):
        cal = fit(counts(tokenizer))
        assert cal is not None and cal.source == "conformance"
        assert 2 < cal.chars_per_token < 8
    # The finer tokenizer puts fewer characters in a token.
    assert fit(counts("other")).chars_per_token < fit(counts("llama3")).chars_per_token  # type: ignore[union-attr]
    # Too few counts, a missing one, nonsense: no calibration (the default applies).
    assert fit([13, 29]) is None
    assert fit([13, None, 70]) is None
    assert fit([100, 10, 1, 1]) is None


def test_a_model_gets_the_most_conservative_calibration_of_its_pools() -> None:
    fine = PromptCalibration(3.0, 4.0, 5.0, "conformance")
    coarse = PromptCalibration(5.0, 6.0, 3.0, "conformance")
    pools = {"a": PoolTarget("a", ("http://127.0.0.1:1",), "US", fine),
             "b": PoolTarget("b", ("http://127.0.0.1:2",), "US", coarse),
             "c": PoolTarget("c", ("http://127.0.0.1:3",), "US")}
    desired = DesiredState(routes=(
        RouteSpec("r1", "m1", "", "", 1, {"a": 10_000, "b": 0}),
        RouteSpec("r2", "m2", "", "", 1, {"c": 10_000}),
    ), pools=pools)
    cals = model_calibrations(desired)
    # Weight 0 counts: b may get weight by a runtime change, without a new script.
    assert cals["m1"] == PromptCalibration(3.0, 6.0, 5.0, "conformance")
    assert cals["m2"] == PromptCalibration()
    lua = routing_lua(desired)
    assert '["m1"] = {3.0, 6.0, 5.0},' in lua and '["m2"] = {4.0, 5.0, 6.0},' in lua
    validate(desired)
    bad = {**pools, "c": PoolTarget("c", ("http://127.0.0.1:3",), "US",
                                    PromptCalibration(0.0, 5.0, 6.0))}
    with pytest.raises(ConfigError, match="pool c: prompt calibration"):
        validate(DesiredState(routes=desired.routes, pools=bad))


@pytest.mark.django_db
def test_pools_are_calibrated_from_their_latest_recorded_parity_counts(
        world: World) -> None:  # noqa: F811
    def record(mine: Sequence[int | None], theirs: Sequence[int | None]) -> None:
        run = ConformanceRun.objects.create(pool=world.candidate, primary=world.primary,
                                            model_id="llama-3.1-8b-instruct", created_by="o")
        ConformanceCase.objects.create(
            run=run, pool=world.candidate, role="pool", endpoint="http://x",
            key="parity.prompt_tokens", title="Prompt-token parity", required=True,
            status="fail", numbers={"pool": mine, "reference": theirs,
                                    "reference_pool": world.primary.name})

    names = [world.candidate.name, world.primary.name]
    assert pool_calibrations(names) == {}
    record(counts("llama3"), counts("llama3"))
    # The later run: the candidate's newest counts; the reference's, missing, are skipped.
    record(counts("other"), [None, None, None, None])
    found = pool_calibrations(names)
    assert found[world.candidate.name] == fit(counts("other"))
    assert found[world.primary.name] == fit(counts("llama3"))
