"""ControlRequests' own flag ``unresolved``: whether this rank holds a request not agreed on yet."""
from distributed_runner.engine.requests import ControlRequests


def test_unresolved_follows_requests_until_they_are_resolved():
    requests = ControlRequests()
    assert requests.unresolved is False
    requests.request("stop", "enough")
    assert requests.unresolved is True
    assert requests.resolve() == {"stop": ("enough",)}  # not distributed: no collective
    assert requests.unresolved is False
    assert requests.resolve() == {}
