"""A config's sections, declared once: who parses each, and what the Ray driver does with it.

Why a table: each section used to be parsed wherever it was read (``watchdog`` in five places,
``launcher`` and ``load_from`` in four, ``strategy`` in three), and the Ray driver carried the
other subsystems' rules by hand; a new section meant edits in four modules and the cluster got
the one that was missed. Here a section is one :class:`Section` row, as a checkpoint part is one
row of :data:`~distributed_runner.checkpoint.parts.PARTS`:

* ``parse``: the owning subsystem's parser, raw value -> the value every reader uses (one
  :class:`~distributed_runner.core.errors.ConfigError` line naming the key for a mistake);
* ``on_driver``: what the Ray driver (and ``drun check``) does with the section before any
  worker starts — paths made absolute (workers run in another folder), object storage noted (the
  driver's credentials are then forwarded), checks against the world size, the model built on the
  meta device and checked against its plan and its files.

:func:`parse_sections` runs every ``parse`` once; the result is a read-only :class:`Settings`
that :func:`~distributed_runner.engine.config_prep.prepare_config` attaches to the prepared
config (:func:`settings_of`). The Runner, its hooks (``runner.settings``), the Ray driver and a
sweep's trials read that object instead of parsing again, so each parser runs once per process.
:func:`run_driver_steps` runs every ``on_driver`` in table order and returns a
:class:`DriverPlan`, which ``drun check`` prints.

The ``launcher`` row belongs to :mod:`distributed_runner.launch`, which sits above the engine:
it adds its row from there (:func:`register_section`), loaded by name at the first parse as the
registries load their built-ins.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# the modules that declare rows, imported by name at the first parse: the engine's own table, and
# the launcher's (launch/ sits above the engine)
SECTION_PROVIDERS = (
    "distributed_runner.engine.config_sections",
    "distributed_runner.launch.launcher_config",
)


class ReadOnlyDict(dict):
    """A parsed section's options: a dict (json, ``**``, ``isinstance(..., dict)`` keep working)
    that refuses to change, so no reader edits what the others read."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "a parsed config section is read-only: change the config and prepare it again"
        )

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple:
        return ReadOnlyDict, (dict(self),)


def _frozen(value: Any) -> Any:
    return ReadOnlyDict(value) if isinstance(value, dict) else value


class Settings(Mapping[str, Any]):
    """The parsed sections of one config, by key, read-only: ``settings.watchdog['hang_timeout']``,
    ``settings.strategy['tp']``. A section absent from the config holds what its parser makes of
    ``None`` (its defaults), or None for an optional section."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", {k: _frozen(v) for k, v in values.items()})

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"no config section {key!r} was parsed") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("settings are read-only: change the config and prepare it again")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({', '.join(self._values)})"


@dataclass
class Stored:
    """A file the driver writes into the run's Ray storage for the workers (the shards' index:
    data/streaming/index.py): ``value.write(uri)`` writes it at ``<storage>/<name>/<relative>``,
    and the config key ``config_path`` (keys from the top) is set to that URI."""

    relative: str
    value: Any  # has write(uri)
    config_path: tuple[str, ...]


@dataclass
class DriverPlan:
    """What the driver steps found and did: ``cfg`` is the plain config the workers get (paths
    made absolute in it), ``remote`` whether some section reads object storage (the workers then
    get the driver's credentials), ``lines`` what ``drun check`` prints, by topic, ``notes``
    the iMIX translations prepare_config made (the workers log them in the run's log) and
    ``stored`` the files the launcher writes into the run's storage before the workers start."""

    cfg: dict
    settings: Settings
    workers: int | tuple[int, int]
    remote: bool = False
    lines: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # prepare_config's iMIX notes
    stored: list[Stored] = field(default_factory=list)

    @property
    def world(self) -> int:
        """The smallest world the workers form (an elastic group starts at its minimum)."""
        return self.workers[0] if isinstance(self.workers, tuple) else self.workers

    def say(self, topic: str, line: str) -> None:
        self.lines.setdefault(topic, []).append(line)


@dataclass(frozen=True)
class Section:
    """One top-level config key (or a family of them), its parser and its driver step.
    ``default``: what an absent key means (the Runner's own default for that argument, e.g.
    ``preemption=True``); ``optional``: parsed only when the config gives it (else None)."""

    key: str
    doc: str
    parse: Callable[[Any], Any] | None = None
    on_driver: Callable[[DriverPlan], None] | None = None
    optional: bool = False
    default: Any = None


_ROWS: list[Section] = []
_PROVIDERS_LOADED: set[str] = set()  # the providers imported so far


def register_section(section: Section) -> Section:
    """Add (or replace, by key) a row: how a layer above the engine declares its section."""
    for i, row in enumerate(_ROWS):
        if row.key == section.key:
            _ROWS[i] = section
            return section
    _ROWS.append(section)
    return section


def sections() -> list[Section]:
    """Every row, the engine's own and those its providers add, in table order."""
    for module in SECTION_PROVIDERS:
        if module not in _PROVIDERS_LOADED:
            _PROVIDERS_LOADED.add(module)
            importlib.import_module(module)
    return list(_ROWS)


def parse_sections(cfg: Mapping[str, Any]) -> Settings:
    """Every section of ``cfg`` parsed by its owner's parser, once: the config's settings."""
    values: dict[str, Any] = {}
    for row in sections():
        if row.parse is None:
            continue
        raw = cfg.get(row.key, row.default)  # absent: the default; given as None: None
        values[row.key] = None if raw is None and row.optional else row.parse(raw)
    return Settings(values)


SETTINGS_ATTR = "_drun_settings"


def attach_settings(cfg: Any, settings: Settings) -> None:
    """Keep ``settings`` with the prepared config (outside its keys, like its file name)."""
    object.__setattr__(cfg, SETTINGS_ATTR, settings)


def settings_of(cfg: Any) -> Settings | None:
    """The settings :func:`prepare_config` attached to ``cfg``, or None (not prepared)."""
    return getattr(cfg, "__dict__", {}).get(SETTINGS_ATTR)


def run_driver_steps(cfg: dict, settings: Settings) -> DriverPlan:
    """Every section's driver step on ``cfg`` (the plain config the workers get, changed in
    place), in table order; raises the first refusal as its one line."""
    launcher = settings.launcher if "launcher" in settings else None
    plan = DriverPlan(cfg, settings, launcher["num_workers"] if launcher else 1)
    for row in sections():
        if row.on_driver is not None:
            row.on_driver(plan)
    return plan
