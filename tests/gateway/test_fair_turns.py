"""Fair turns between keys on one engine: the busy share and first token first
(sm120.gateway.limits), through the team (sm120.gateway.admission) and the tap that sees an
answer's first event (sm120.gateway.usage)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sm120.gateway.admission import Team, Ticket
from sm120.gateway.config import GatewayConfig, TurnPolicy
from sm120.gateway.control import GatewayError, check_config, gateway_argv
from sm120.gateway.keys import KeyEntry, KeyRing, KeyStore
from sm120.gateway.limits import BUSY_KEY_S, Turns, busy_share_of

HOLD = TurnPolicy(busy_share=0.5, first_token_hold_s=5.0)


def entered(turns: Turns, key: str, times: int, now: float) -> int:
    return sum(turns.try_enter(key, now=now) for _ in range(times))


@pytest.mark.parametrize(
    ("capacity", "busy_share", "slots"),
    [(64, 0.5, 32), (64, 0.25, 16), (64, 0.75, 48), (64, 1.0, 48), (4, 0.5, 2), (2, 0.1, 1)],
)
def test_the_busy_share_is_a_part_of_the_slots_never_more_than_the_reserve_allows(
    capacity: int, busy_share: float, slots: int
) -> None:
    assert busy_share_of(capacity, busy_share) == slots


def test_a_flood_holds_every_slot_alone_three_quarters_beside_a_recent_key_half_beside_a_busy_one(
) -> None:  # fmt: skip
    policy = TurnPolicy(busy_share=0.5, first_token_hold_s=0)
    alone = Turns(64, policy)
    assert entered(alone, "flood", 65, now=1000.0) == 64

    turns = Turns(64, policy)
    assert turns.try_enter("agent", now=1000.0)
    turns.leave("agent")
    later = 1000.0 + BUSY_KEY_S + 30  # the agent was here 60 s ago: present, not busy
    assert entered(turns, "flood", 64, now=later) == 48
    # The agent is back: busy, so each key's share is 32 (the flood keeps what it holds).
    assert turns.try_enter("agent", now=later + 1)
    assert turns.held == {"agent": 1, "flood": 48}
    assert not turns.try_enter("flood", now=later + 1)
    for _ in range(17):
        turns.leave("flood")
    assert entered(turns, "flood", 5, now=later + 1) == 1  # back up to 32, no further


def test_a_key_whose_request_is_in_flight_stays_busy_past_the_window() -> None:
    turns = Turns(64, TurnPolicy(busy_share=0.5, first_token_hold_s=0))
    assert turns.try_enter("agent", now=1000.0)  # a long request: still in flight
    assert entered(turns, "flood", 64, now=1000.0 + BUSY_KEY_S + 5) == 32


def test_first_token_first_holds_a_heavier_keys_new_requests_until_the_first_token() -> None:
    async def scenario() -> None:
        turns = Turns(64, HOLD)
        assert entered(turns, "flood", 20, now=time.monotonic()) == 20
        assert turns.try_enter("agent")
        first = turns.await_first_token("agent")
        assert first is not None
        # The flood's next request waits; a key lighter than the agent's does not.
        assert not turns.try_enter("flood")
        flood_next = asyncio.ensure_future(turns.enter("flood"))
        assert turns.try_enter("carol")
        await asyncio.sleep(0.01)
        assert not flood_next.done() and turns.held["flood"] == 20
        turns.first_token(first)
        assert await asyncio.wait_for(flood_next, 1) is True
        assert turns.held["flood"] == 21 and not turns.firsts

    asyncio.run(scenario())


def test_the_hold_ends_by_itself_when_no_first_token_comes() -> None:
    async def scenario() -> float:
        turns = Turns(64, TurnPolicy(busy_share=0.5, first_token_hold_s=0.05))
        entered(turns, "flood", 20, now=time.monotonic())
        assert turns.try_enter("agent")
        assert turns.await_first_token("agent") is not None
        started = time.monotonic()
        assert await asyncio.wait_for(turns.enter("flood"), 2) is True
        return time.monotonic() - started

    waited = asyncio.run(scenario())
    assert 0.04 <= waited < 1.0


def test_no_hold_for_the_heaviest_key_nor_below_the_floor_nor_when_off() -> None:
    turns = Turns(64, HOLD)
    now = time.monotonic()
    entered(turns, "flood", 7, now)  # below max(1, 64 // 8): never held back
    assert turns.try_enter("agent", now=now)
    assert turns.await_first_token("agent", now=now) is not None
    assert turns.try_enter("flood", now=now)  # now 8: held back from here on
    assert not turns.try_enter("flood", now=now)
    # The flood's own requests wait for nothing: no other key holds more.
    assert turns.await_first_token("flood", now=now) is None

    off = Turns(64, TurnPolicy(busy_share=0.5, first_token_hold_s=0))
    entered(off, "flood", 20, now)
    assert off.try_enter("agent", now=now)
    assert off.await_first_token("agent", now=now) is None
    assert off.try_enter("flood", now=now)


def team_ticket(team: Team, name: str) -> Ticket:
    ticket = team.admit(KeyEntry(name, ""), "dep", 64, "tiny", "chat")
    assert isinstance(ticket, Ticket)
    return ticket


def test_the_answers_first_event_ends_the_hold_through_the_team(tmp_path: Path) -> None:
    async def scenario() -> None:
        team = Team(KeyRing("admin-key", KeyStore(tmp_path)), policy=HOLD)
        floods = [team_ticket(team, "flood") for _ in range(10)]
        assert all(team.take_turn(ticket) for ticket in floods)
        agent = team_ticket(team, "agent")
        assert team.take_turn(agent) and agent.first is not None
        held = team_ticket(team, "flood")
        assert not team.take_turn(held)
        waiting = asyncio.ensure_future(team.wait_turn(held))
        agent.tap.seen(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        await asyncio.sleep(0.01)
        assert not waiting.done()  # the head is no token
        agent.tap.seen(b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n')
        assert await asyncio.wait_for(waiting, 1) is None
        # The wait shows in the gateway's metrics: one request of the flood's, 10 ms or more.
        assert team.meter.turn_waits["flood"] == 1 and team.meter.turn_wait_s["flood"] >= 0.01
        assert 'sm120_gateway_turn_waits_total{key="flood"} 1' in team.meter.render()
        # A request that ends before any event ends its hold too.
        second = team_ticket(team, "agent")
        assert team.take_turn(second) and second.first is not None
        team.finish(second, 500)
        assert not team.turns.of("dep", 64).firsts
        for ticket in [*floods, held, agent]:
            team.finish(ticket, 200)
        assert team.turns.of("dep", 64).total == 0

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (TurnPolicy(busy_share=0), "--busy-share must be above 0 and at most 1, not 0"),
        (TurnPolicy(busy_share=1.5), "--busy-share must be above 0 and at most 1, not 1.5"),
        (
            TurnPolicy(first_token_hold_s=-1),
            "--first-token-hold must be 0 to 30 seconds, not -1",
        ),
    ],
)
def test_the_library_refuses_a_turn_policy_out_of_range(policy: TurnPolicy, message: str) -> None:
    with pytest.raises(GatewayError, match=f"^{message}$"):
        check_config(GatewayConfig(turns=policy))


def test_the_detached_gateway_gets_the_turn_policy() -> None:
    assert "--busy-share" not in gateway_argv(GatewayConfig())
    argv = gateway_argv(GatewayConfig(turns=TurnPolicy(0.25, 0.0)))
    at = argv.index("--busy-share")
    assert argv[at : at + 4] == ["--busy-share", "0.25", "--first-token-hold", "0.0"]
