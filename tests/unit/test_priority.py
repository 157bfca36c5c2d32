import pytest

from distributed_runner.core.errors import ConfigError
from hooks import Priority, get_priority


def test_nine_levels_with_mmengine_values():
    assert {p.name: p.value for p in Priority} == {
        "HIGHEST": 0, "VERY_HIGH": 10, "HIGH": 30, "ABOVE_NORMAL": 40, "NORMAL": 50,
        "BELOW_NORMAL": 60, "LOW": 70, "VERY_LOW": 90, "LOWEST": 100}


@pytest.mark.parametrize("value,expected", [
    (Priority.HIGH, 30), ("ABOVE_NORMAL", 40), ("above_normal", 40), ("Very_Low", 90),
    (0, 0), (100, 100), (45, 45)])
def test_accepted_forms(value, expected):
    assert get_priority(value) == expected


@pytest.mark.parametrize("value,fragment", [
    (101, "out of range"), (-1, "out of range"), ("NORMALL", "did you mean 'NORMAL'"),
    (1.5, "got float"), (True, "got bool"), (None, "got NoneType")])
def test_rejected_forms_are_one_line(value, fragment):
    with pytest.raises(ConfigError) as err:
        get_priority(value, "custom_hooks[0].priority")
    msg = str(err.value)
    assert fragment in msg and msg.startswith("custom_hooks[0].priority:") and "\n" not in msg
