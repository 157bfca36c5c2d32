"""StreamingLoader(pack=...): token documents of different lengths, each followed by the
end-of-sequence token, concatenated and cut into rows of seq_len, per stream; checked against
the rows computed here from the raw documents (transformers' ``group_texts`` rule: the remainder
is dropped). A packed stream resumes from the cursor the checkpoint keeps, at any world size,
without counting the trained documents again; without a cursor it counts them, and says so."""
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from distributed_runner.data.loaders import build_dataloader

EOS = 0
L = 16


def documents(count=600, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 250, size=int(n)).tolist() for n in rng.integers(0, 40, size=count)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokens")
    docs = documents()
    for f, part in enumerate(np.array_split(np.arange(len(docs)), 3)):
        table = pa.table({"tokens": pa.array([docs[i] for i in part], pa.list_(pa.int32())),
                          "doc": pa.array(part, pa.int64())})
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=25)
    return folder, docs


def packed(folder, world=1, rank=0, batch_size=4, **extra):
    spec = dict(type="StreamingLoader", batch_size=batch_size, num_streams=4, shuffle_window=8,
                dataset=dict(type="ParquetShards", paths=str(folder), columns=["tokens"]),
                pack=dict(column="tokens", seq_len=L, eos_token_id=EOS),
                rank=rank, world_size=world)
    spec.update(extra)
    return build_dataloader(spec, "train_dataloader", seed=5)


def rows_of(loader):
    return [row for batch in loader for row in batch["input_ids"].tolist()]


def test_one_unshuffled_stream_packs_as_group_texts_does(corpus):
    folder, docs = corpus
    stream = [t for doc in docs for t in doc + [EOS]]
    expected = np.asarray(stream[: len(stream) // L * L]).reshape(-1, L)
    loader = packed(folder, num_streams=1, shuffle=False, batch_size=1)
    batches = list(loader)
    got = np.asarray([row for b in batches for row in b["input_ids"].tolist()])
    assert got.shape == expected.shape and (got == expected).all()
    assert all((b["labels"] == b["input_ids"]).all() for b in batches)
    assert set(batches[0]) == {"input_ids", "labels"}


def global_rows(folder, world, start=0, states=None, **extra):
    per_rank, loaders = [], []
    for rank in range(world):
        ld = packed(folder, world, rank, batch_size=4 // world, **extra)
        ld.sampler.resume_at(start * (4 // world))
        if states is not None:
            ld.restore_train_data(states)
        per_rank.append([b["input_ids"].tolist() for b in ld])
        loaders.append(ld)
    out = []
    for g in range(len(per_rank[0])):
        batch = [None] * 4
        for rank in range(world):
            batch[rank::world] = per_rank[rank][g]
        out.extend(batch)
    return out, loaders


def test_shuffled_streams_pack_whole_documents_and_match_at_any_size(corpus):
    folder, docs = corpus
    alone, _ = global_rows(folder, 1)
    assert global_rows(folder, 2)[0] == alone
    assert global_rows(folder, 2, num_workers=2)[0] == alone
    tokens = [t for row in alone for t in row]
    assert sum(t == EOS for t in tokens) > 0.8 * len(docs)  # most documents are in the epoch
    counts = np.bincount(tokens, minlength=256)
    available = np.bincount([t for d in docs for t in d], minlength=256)
    assert (counts[1:] <= available[1:]).all()  # no token more often than the corpus has it


def test_a_packed_run_resumes_from_the_checkpoints_cursors_at_another_size(corpus, caplog):
    folder, _ = corpus
    whole, _ = global_rows(folder, 1)
    steps = len(whole) // 4
    stop = steps * 2 // 3
    # two ranks train `stop` steps, then save their parts of the train_data state
    states = []
    for rank in range(2):
        ld = packed(folder, 2, rank, batch_size=2)
        it = iter(ld)
        for _ in range(stop):
            next(it)
        states.append(ld.train_data_state())
    assert all(s["cursors"] for s in states)
    with caplog.at_level(logging.WARNING, logger="distributed_runner"):
        resumed, _ = global_rows(folder, 1, start=stop, states=states)
    assert resumed == whole[stop * 4:]
    assert "counting the tokens" not in caplog.text  # found by cursor, nothing re-read
    with caplog.at_level(logging.WARNING, logger="distributed_runner"):
        blind, _ = global_rows(folder, 1, start=stop)  # no cursors: counts its way there
    assert blind == resumed and "counting the tokens" in caplog.text


def test_a_runner_checkpoint_keeps_the_cursors_and_resumes_exactly(corpus, tmp_path):
    folder, _ = corpus

    def cfg(work_dir, **extra):
        out = dict(
            work_dir=str(work_dir), run_name=".",
            model=dict(type="transformers.GPT2LMHeadModel",
                       config=dict(type="transformers.GPT2Config", vocab_size=256,
                                   n_positions=L, n_embd=16, n_layer=1, n_head=2,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
            train_dataloader=dict(type="StreamingLoader", batch_size=4, num_streams=4,
                                  shuffle_window=8,
                                  dataset=dict(type="ParquetShards", paths=str(folder),
                                               columns=["tokens"]),
                                  pack=dict(column="tokens", seq_len=L, eos_token_id=EOS)),
            train_cfg=dict(by_epoch=True, max_epochs=2),
            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)),
            default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=7,
                                               by_epoch=False)),
            randomness=dict(seed=1), log_level="WARNING")
        out.update(extra)
        return out

    pytest.importorskip("transformers")
    whole = Runner.from_cfg(cfg(tmp_path / "whole"))
    whole.train()
    saved = __import__("torch").load(tmp_path / "whole" / "iter_14.pth", weights_only=False)
    assert saved["train_data"]["ranks"][0]["cursors"]
    resumed = Runner.from_cfg(cfg(tmp_path / "resumed", resume=str(tmp_path / "whole" / "iter_14.pth")))
    resumed.train()
    (log,) = (tmp_path / "resumed").rglob("run.log")
    assert "counting the tokens" not in log.read_text()  # the cursors were in the checkpoint
    for name, value in whole.model.state_dict().items():
        assert (resumed.model.state_dict()[name] == value).all(), name


def test_packing_mistakes_are_one_line(corpus):
    folder, _ = corpus
    with pytest.raises(ConfigError, match=r"^train_dataloader.pack.column: 'doc' must be a list "):
        packed(folder, dataset=dict(type="ParquetShards", paths=str(folder)),
               pack=dict(column="doc", seq_len=L, eos_token_id=EOS))
    with pytest.raises(ConfigError, match=r"^train_dataloader.pack.seq_lenght: unknown key"):
        packed(folder, pack=dict(column="tokens", seq_lenght=L, eos_token_id=EOS))
    with pytest.raises(ConfigError, match=r"leave 4 streams no full global batch"):
        packed(folder, pack=dict(column="tokens", seq_len=10**6, eos_token_id=EOS))
