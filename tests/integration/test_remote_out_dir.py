"""CheckpointHook(out_dir='s3://...') against a real S3-compatible server on 127.0.0.1 (moto's
``moto_server``, from PyPI): the committed checkpoints, their checksums, the best and the published
files arrive under ``out_dir/<basename(work_dir)>`` byte for byte, replaced ones are deleted there
too, and mistakes in the filesystem options are one line before training."""
import pytest

from distributed_runner.core.errors import ConfigError
from tests.toy import free_port, make_runner

pytestmark = [pytest.mark.integration, pytest.mark.slow("moto's S3 server and runs writing to it"),
              pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def s3(s3_server):
    """The session's S3 server (conftest.py) with a bucket; yields (its options, fs)."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(allow_bucket_creation=True, **s3_server)
    fs.create_dir("checkpoints")
    return s3_server, fs


def remote_files(fs, folder):
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(folder, recursive=True))
    return sorted(i.path[len(folder) + 1:] for i in infos if i.type == pafs.FileType.File)


def test_checkpoints_are_copied_to_s3_and_replaced_ones_deleted_there(s3, tmp_path):
    options, fs = s3
    work_dir = tmp_path / "digits_run"
    checkpoint = dict(type="CheckpointHook", interval=1, max_keep_ckpts=2, save_best="accuracy",
                      out_dir="s3://checkpoints/team", backend_args=options,
                      published_keys=["meta", "state_dict"])
    runner = make_runner(work_dir, default_hooks=dict(checkpoint=checkpoint))
    runner.train()
    local = sorted(p.name for p in work_dir.iterdir() if p.name.endswith((".pth", ".crc32")))
    remote = remote_files(fs, "checkpoints/team/digits_run")
    assert remote == local  # everything committed here is there, nothing more
    assert "epoch_3.pth" in remote and "epoch_1.pth" not in remote  # max_keep_ckpts=2
    assert any(n.startswith("best_accuracy_epoch_") for n in remote)
    assert any(n.startswith("epoch_3-") for n in remote)  # the published file
    with fs.open_input_stream("checkpoints/team/digits_run/epoch_3.pth") as f:
        assert f.read() == (work_dir / "epoch_3.pth").read_bytes()


def test_filesystem_option_mistakes_are_one_line_before_training(tmp_path):
    hook = dict(type="CheckpointHook", interval=1, out_dir="s3://checkpoints/x",
                backend_args=dict(endpoint_overide="127.0.0.1:1"))
    with pytest.raises(ConfigError, match=r"default_hooks.checkpoint.backend_args: "
                                          r"pyarrow.fs.S3FileSystem rejected them"):
        make_runner(tmp_path, default_hooks=dict(checkpoint=hook))
    hook = dict(type="CheckpointHook", interval=1, backend_args=dict(region="x"))
    with pytest.raises(ConfigError, match="only a remote out_dir"):
        make_runner(tmp_path, default_hooks=dict(checkpoint=hook))
    hook = dict(type="CheckpointHook", file_client_args=dict(backend="petrel"))
    with pytest.raises(ConfigError, match="backend 'petrel' is not supported"):
        make_runner(tmp_path, default_hooks=dict(checkpoint=hook))
    logger = dict(type="LoggerHook", file_client_args=dict(backend="petrel"))  # the same rules
    with pytest.raises(ConfigError, match="logger.file_client_args: backend 'petrel'"):
        make_runner(tmp_path, default_hooks=dict(logger=logger))
    with pytest.warns(DeprecationWarning, match="file_client_args is deprecated"):
        make_runner(tmp_path, default_hooks=dict(checkpoint=dict(
            type="CheckpointHook", file_client_args=dict(backend="disk"))))


def test_an_unreachable_out_dir_is_logged_and_training_finishes(tmp_path):
    port = free_port()  # nothing listens here
    options = dict(endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1",
                   access_key="testing", secret_key="testing", connect_timeout=0.5,
                   request_timeout=0.5)
    checkpoint = dict(type="CheckpointHook", interval=1, out_dir="s3://checkpoints/down",
                      backend_args=options)
    runner = make_runner(tmp_path / "wd", default_hooks=dict(checkpoint=checkpoint),
                         train_cfg=dict(by_epoch=True, max_epochs=1))
    runner.train()
    assert (tmp_path / "wd" / "epoch_1.pth").is_file()  # the local copy is the checkpoint
    log = (tmp_path / "wd" / "logs" / "run.log").read_text()
    assert "of the copies to out_dir s3://checkpoints/down/wd failed" in log


def test_logger_hook_out_dir_copies_the_logs_to_s3_and_keep_local_false_deletes_them(s3,
                                                                                    tmp_path):
    options, fs = s3
    logger = dict(type="LoggerHook", interval=5, out_dir="s3://checkpoints/logs",
                  backend_args=options, keep_local=False, interval_exp_name=10)
    runner = make_runner(tmp_path / "exp", default_hooks=dict(logger=logger), log_level="INFO")
    runner.train()
    remote = remote_files(fs, "checkpoints/logs/exp")
    assert remote == ["config.py", "logs/run.log", "logs/scalars.jsonl"]
    with fs.open_input_stream("checkpoints/logs/exp/logs/scalars.jsonl") as f:
        records = f.read().decode().splitlines()
    assert len(records) == 3 * 2 + 3  # every train record (2 an epoch) and every validation
    with fs.open_input_stream("checkpoints/logs/exp/logs/run.log") as f:
        assert f.read().decode().count("Exp name: exp") == 3  # every 10 iterations (MMEngine)
    assert not (tmp_path / "exp" / "logs" / "scalars.jsonl").exists()  # keep_local=False
    assert (tmp_path / "exp" / "epoch_3.pth").is_file()  # checkpoints are not logs
