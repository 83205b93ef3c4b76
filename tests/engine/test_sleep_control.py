"""The frontend's sleep gate alone (the engine's side runs in tests/entrypoints/test_model_pool_server.py
and tests/engine/test_features_meet.py): while asleep a request is refused naming /wake_up, or with
--wake-on-request lets the engine wake for it; a bad level or requests in flight are refused before
anything reaches the engine."""

import asyncio

import pytest

from pagedserve.engine.sleep_control import SleepControl
from pagedserve.errors import EngineAsleepError, InvalidRequestError


def asleep(wake_on_request: bool) -> SleepControl:
    control = SleepControl(client=None)  # type: ignore[arg-type]  # NOTE: the gate never reaches the client
    control.wake_on_request = wake_on_request
    control.answered(2)  # the engine's answer to SLEEP level 2
    return control


def test_a_request_while_asleep_is_refused_naming_wake_up():
    control = asleep(wake_on_request=False)
    with pytest.raises(
        EngineAsleepError, match=r"POST /wake_up first, or start the server with --wake-on-request"
    ):
        control.before_submit()
    assert control.level == 2


def test_with_wake_on_request_the_request_goes_through_and_wakes_it():
    control = asleep(wake_on_request=True)
    control.before_submit()
    assert control.level == 0  # NOTE: the engine core wakes before it takes the request


@pytest.mark.parametrize("level", [0, 3, -1, 2**64, True, 1.5])
def test_bad_levels_are_refused_naming_level(level):
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(SleepControl(client=None).sleep(level, 0))  # type: ignore[arg-type]
    assert info.value.param == "level" and info.value.status_code == 400


def test_sleep_is_refused_while_requests_are_in_flight():
    with pytest.raises(InvalidRequestError, match="3 request") as info:
        asyncio.run(SleepControl(client=None).sleep(1, 3))  # type: ignore[arg-type]
    assert info.value.status_code == 409
