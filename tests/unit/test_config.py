"""Config files: Python and YAML, _base_ inheritance, _delete_, --cfg-options, custom_imports."""
import sys
import textwrap

import pytest

from distributed_runner.core.config import Config, parse_value
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import HOOKS


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_python_config_keeps_values_not_modules(tmp_path):
    cfg = Config.fromfile(write(tmp_path / "a.py", """
        import os
        x = 1
        model = dict(type='ToyModel', hidden=4)
        def helper(): pass
    """))
    assert dict(cfg) == {"x": 1, "model": {"type": "ToyModel", "hidden": 4}}
    assert cfg.model.hidden == 4 and cfg.filename == str(tmp_path / "a.py")


def test_yaml_config_with_python_base(tmp_path):
    write(tmp_path / "base.py", """
        model = dict(type='ToyModel', hidden=4, dropout=0.5)
        train_cfg = dict(by_epoch=True, max_epochs=3)
        optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9))
    """)
    cfg = Config.fromfile(write(tmp_path / "child.yaml", """
        _base_: base.py
        model: {hidden: 16}
        optim_wrapper:
          optimizer: {_delete_: true, type: AdamW, lr: 0.001}
    """))
    assert cfg.model == {"type": "ToyModel", "hidden": 16, "dropout": 0.5}
    assert cfg.optim_wrapper.optimizer == {"type": "AdamW", "lr": 0.001}  # replaced, no momentum
    assert cfg.train_cfg.max_epochs == 3


def test_multiple_bases_later_wins_and_nested_bases(tmp_path):
    write(tmp_path / "a.py", "x = dict(a=1, b=1)\n")
    write(tmp_path / "b.py", "_base_ = 'a.py'\nx = dict(b=2, c=2)\n")
    write(tmp_path / "c.py", "y = 3\n")
    cfg = Config.fromfile(write(tmp_path / "d.py", "_base_ = ['b.py', 'c.py']\nx = dict(c=4)\n"))
    assert cfg.x == {"a": 1, "b": 2, "c": 4} and cfg.y == 3


def test_cfg_options(tmp_path):
    path = write(tmp_path / "a.py", """
        train_cfg = dict(max_epochs=3)
        custom_hooks = [dict(type='EMAHook', momentum=0.1)]
    """)
    cfg = Config.fromfile(path, cfg_options=["train_cfg.max_epochs=5", "x=[1,2]",
                                             "custom_hooks.0.momentum=0.5", "new.key=abc",
                                             "flag=true", "nothing=None", "names=[a,b]"])
    assert cfg.train_cfg.max_epochs == 5 and cfg.x == [1, 2]
    assert cfg.custom_hooks[0]["momentum"] == 0.5 and cfg.new.key == "abc"
    assert cfg.flag is True and cfg.nothing is None and cfg.names == ["a", "b"]


@pytest.mark.parametrize("raw,value", [("1", 1), ("1.5", 1.5), ("'s'", "s"), ("abc", "abc"),
                                       ("(1,2)", (1, 2)), ("False", False), ("null", None)])
def test_parse_value(raw, value):
    assert parse_value(raw) == value


def test_custom_imports_register_the_users_hooks(tmp_path, monkeypatch):
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg / "my_hooks.py", """
        from hooks import HOOKS, Hook

        @HOOKS.register_module(force=True)
        class MyImportedHook(Hook):
            pass
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    Config.fromfile(write(tmp_path / "cfg.py",
                          "custom_imports = dict(imports=['my_pkg.my_hooks'])\n"))
    assert HOOKS.get("MyImportedHook") is not None
    sys.modules.pop("my_pkg.my_hooks", None)


@pytest.mark.parametrize("name,text,fragment", [
    ("missing.py", None, "config file not found"),
    ("bad.py", "x = (\n", "syntax error on line"),
    ("bad.yaml", "a: [1,\n", "not valid YAML"),
    ("list.yaml", "- 1\n- 2\n", "must be a mapping"),
    ("cfg.txt", "x=1", "unsupported config type"),
    ("imp.py", "custom_imports = dict(imports=['no_such_module_xyz'])\n", "cannot import"),
])
def test_bad_config_files_are_one_line(tmp_path, name, text, fragment):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        Config.fromfile(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_base_cycle_is_reported(tmp_path):
    write(tmp_path / "a.py", "_base_ = 'b.py'\n")
    write(tmp_path / "b.py", "_base_ = 'a.py'\n")
    with pytest.raises(ConfigError, match="_base_ cycle"):
        Config.fromfile(tmp_path / "a.py")


def test_bad_cfg_option_is_one_line(tmp_path):
    path = write(tmp_path / "a.py", "x = [1]\n")
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        Config.fromfile(path, cfg_options=["novalue"])
    with pytest.raises(ConfigError, match="not an index"):
        Config.fromfile(path, cfg_options=["x.3=1"])


def test_pretty_text_round_trips(tmp_path):
    cfg = Config.fromfile(write(tmp_path / "a.py", "a = dict(b=[1, 2], c='x')\nd = (1, 2)\n"))
    again = Config.fromfile(write(tmp_path / "dump.py", cfg.pretty_text()))
    assert dict(again) == dict(cfg)
