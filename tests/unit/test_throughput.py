"""IterTimerHook's throughput: samples/s, tokens/s and MFU, exact over each logging window."""
import json
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import hooks.iter_timer_hook as timer_module
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import DATASETS, MODELS
from distributed_runner.tracking.throughput import (
    ThroughputMeter,
    flop_params,
    peak_tflops_of,
    sample_counter,
    token_counter,
)
from tests.toy import ListSink, ToyGPT, make_runner

STEPS = (0.125, 0.25, 0.0625, 0.5)  # exact in binary: the expected rates are exact too


@pytest.fixture
def fake_clock(monkeypatch):
    """IterTimerHook's clock advances by the next of STEPS at every reading."""
    state = {"now": 100.0, "i": 0}

    def perf_counter():
        state["now"] += STEPS[state["i"] % len(STEPS)]
        state["i"] += 1
        return state["now"]

    monkeypatch.setattr(timer_module, "perf_counter", perf_counter)
    monkeypatch.setattr(timer_module, "time", types.SimpleNamespace(perf_counter=perf_counter))


@DATASETS.register_module(force=True)
class PaddedTokens(Dataset):
    """Sequences of 6 token ids; sample i has 6 - i % 4 real tokens (the rest padding)."""

    def __init__(self, n: int = 10) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 16, (n, 6), generator=g)
        self.mask = torch.stack([(torch.arange(6) < 6 - i % 4).long() for i in range(n)])

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


@MODELS.register_module(force=True)
class TinyLMHeadModel(nn.Module):
    """Named like a Hugging Face causal LM, so ``flops_per_token='auto'`` takes 6N."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, input_ids, attention_mask=None, mode="predict"):
        logits = self.head(self.embed(input_ids))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits[:, :-1].flatten(0, 1),
                                            input_ids[:, 1:].flatten())}
        return logits


def windows(values: list, steps: list) -> list:
    """``values`` cut at the record steps: [1..s0], [s0+1..s1], ..."""
    out, start = [], 0
    for step in steps:
        out.append(values[start:step])
        start = step
    return out


def test_samples_per_s_is_exact_over_each_window_and_in_the_json_lines(tmp_path, fake_clock):
    sink = ListSink()
    # 42 samples, batch 4: 11 iterations an epoch, the last one of 2 samples
    runner = make_runner(tmp_path, train_dataloader=dict(
        dataset=dict(type="ToyDataset", n=42), batch_size=4,
        sampler=dict(type="DefaultSampler", shuffle=False)),
        train_cfg=dict(by_epoch=True, max_epochs=1), val_cfg=None, val_dataloader=None,
        val_evaluator=None, default_hooks=dict(
            logger=dict(type="LoggerHook", interval=5, ignore_last=False,
                        sinks=["jsonl", sink]), checkpoint=None))
    runner.train()
    times = runner.message_hub.get_scalar("train/time").values()
    samples = [4] * 10 + [2]
    train = [r for r in sink.records if r.mode == "train"]
    assert [r.step for r in train] == [5, 10, 11]
    for record, t, n in zip(train, windows(times, [5, 10, 11]), windows(samples, [5, 10, 11])):
        assert record.scalars["samples_per_s"] == pytest.approx(sum(n) / sum(t), rel=1e-12)
        assert "tokens_per_s" not in record.scalars and "mfu" not in record.scalars
    assert len(set(times)) > 1  # uneven iterations: a mean of rates would differ
    lines = [json.loads(x) for x in (tmp_path / "logs" / "scalars.jsonl").read_text().splitlines()]
    assert [x["samples_per_s"] for x in lines if x["mode"] == "train"] == \
        [r.scalars["samples_per_s"] for r in train]


def lm_runner(tmp_path, sink, **timer):
    return make_runner(  # on the CPU, whose peak no table knows, also where a GPU is present
        tmp_path, model=dict(type="TinyLMHeadModel"), device="cpu",
        train_dataloader=dict(dataset=dict(type="PaddedTokens", n=10), batch_size=3,
                              sampler=dict(type="DefaultSampler", shuffle=False)),
        train_cfg=dict(by_epoch=True, max_epochs=1), val_cfg=None, val_dataloader=None,
        val_evaluator=None, default_hooks=dict(
            timer=dict(type="IterTimerHook", **timer), checkpoint=None,
            logger=dict(type="LoggerHook", interval=2, ignore_last=False, sinks=["jsonl", sink])))


def test_tokens_and_mfu_from_the_attention_mask_match_a_hand_computation(tmp_path, fake_clock):
    sink = ListSink()
    runner = lm_runner(tmp_path, sink, peak_tflops=2e-6)  # configured: no peak on a CPU
    runner.train()
    mask = PaddedTokens(10).mask
    tokens = [int(mask[i:i + 3].sum()) for i in range(0, 10, 3)]  # batches 3, 3, 3, 1
    samples = [3, 3, 3, 1]
    n = 8 * 16 + 16  # the head; the embedding is a lookup
    assert flop_params(runner.model) == n
    times = runner.message_hub.get_scalar("train/time").values()
    train = [r for r in sink.records if r.mode == "train"]
    assert [r.step for r in train] == [2, 4]
    for record, t, k, s in zip(train, windows(times, [2, 4]), windows(tokens, [2, 4]),
                               windows(samples, [2, 4])):
        assert record.scalars["samples_per_s"] == pytest.approx(sum(s) / sum(t), rel=1e-12)
        assert record.scalars["tokens_per_s"] == pytest.approx(sum(k) / sum(t), rel=1e-6)
        assert record.scalars["mfu"] == pytest.approx(
            sum(k) / sum(t) * 6 * n / 2e6, rel=1e-6)  # tokens/s x FLOPs/token / peak
    line = json.loads((tmp_path / "logs" / "scalars.jsonl").read_text().splitlines()[-1])
    assert {"samples_per_s", "tokens_per_s", "mfu"} <= set(line)


def test_mask_sums_stay_tensors_until_a_record_reads_them(tmp_path, fake_clock):
    """No .item() per iteration: the sums a record has not read yet are still tensors."""
    sink = ListSink()
    runner = make_runner(
        tmp_path, model=dict(type="TinyLMHeadModel"),
        train_dataloader=dict(dataset=dict(type="PaddedTokens", n=10), batch_size=2,
                              sampler=dict(type="DefaultSampler", shuffle=False)),
        train_cfg=dict(by_epoch=True, max_epochs=1), val_cfg=None, val_dataloader=None,
        val_evaluator=None, default_hooks=dict(checkpoint=None, logger=dict(
            type="LoggerHook", interval=3, sinks=[sink])))
    runner.train()  # 5 iterations, a record after the 3rd
    values = list(runner.message_hub.get_scalar("train/tokens_per_s")._values)
    assert [torch.is_tensor(v) for v in values] == [False] * 3 + [True] * 2
    assert all(type(v) is float for v in runner.message_hub.get_scalar("train/samples_per_s")
               ._values)


def test_declared_flops_and_keys_and_switching_off(tmp_path, fake_clock):
    sink = ListSink()
    runner = lm_runner(tmp_path, sink, tokens_key="input_ids", flops_per_token=1000.0,
                       peak_tflops={"cpu-never": 1.0})  # a pattern table without this device
    runner.train()
    record = [r for r in sink.records if r.mode == "train"][0]
    times = runner.message_hub.get_scalar("train/time").values()[:2]
    assert record.scalars["tokens_per_s"] == pytest.approx(2 * 3 * 6 / sum(times), rel=1e-12)
    assert "mfu" not in record.scalars  # no peak for a CPU

    sink = ListSink()
    lm_runner(tmp_path / "off", sink, samples_key=None, tokens_key=None).train()
    record = [r for r in sink.records if r.mode == "train"][0]
    assert not {"samples_per_s", "tokens_per_s", "mfu"} & set(record.scalars)


@pytest.mark.parametrize("option, value, key", [
    ("tokens_kye", "input_ids", "default_hooks.timer.tokens_kye"),
    ("flops_per_token", "6M", "default_hooks.timer.flops_per_token"),
    ("peak_tflops", "H100", "default_hooks.timer.peak_tflops"),
    ("samples_key", 3, "default_hooks.timer.samples_key"),
])
def test_a_bad_option_is_one_line_naming_its_key(tmp_path, option, value, key):
    with pytest.raises(ConfigError) as e:
        make_runner(tmp_path, default_hooks=dict(timer=dict(type="IterTimerHook",
                                                            **{option: value})))
    assert str(e.value).startswith(key + ":") and "\n" not in str(e.value)


def test_peak_table_matches_device_names():
    assert peak_tflops_of("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops_of("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops_of("NVIDIA H200") == peak_tflops_of("NVIDIA GH200 480GB") == 989.4
    assert peak_tflops_of("NVIDIA A100-SXM4-80GB") == peak_tflops_of("NVIDIA A100 80GB PCIe") == 312
    assert peak_tflops_of("NVIDIA A10G") == 70.0 and peak_tflops_of("NVIDIA A10") == 125.0
    assert peak_tflops_of("NVIDIA L4") == 121.0 and peak_tflops_of("NVIDIA L40S") == 362.1
    assert peak_tflops_of("NVIDIA GeForce RTX 4090") == 165.2
    assert peak_tflops_of("Tesla V100-SXM2-16GB") == 125.0
    assert peak_tflops_of("Some CPU") is None
    assert peak_tflops_of("NVIDIA H100 80GB HBM3", {"H100": 900}) == 900.0


def test_6n_counts_a_tied_head_once_and_skips_lookup_tables():
    gpt = ToyGPT()
    everything = sum(p.numel() for p in gpt.parameters())  # the tied table once
    assert flop_params(gpt) == everything - gpt.pos.weight.numel()
    meter = ThroughputMeter(flops_per_token="6N", peak_tflops=100.0)
    meter.start(gpt, torch.device("cpu"), world_size=2)
    assert meter.flops == 6 * flop_params(gpt) and meter.peak == 100.0
    auto = ThroughputMeter()
    auto.start(gpt, torch.device("cpu"), world_size=1)
    assert auto.flops is None  # not named like a causal LM, no declared flops_per_token
    gpt.flops_per_token = 1234
    auto.start(gpt, torch.device("cpu"), world_size=1)
    assert auto.flops == 1234.0


def test_counters_for_the_batch_shapes():
    ids = torch.zeros(3, 5, dtype=torch.long)
    assert sample_counter({"inputs": ids}, "auto")({"inputs": ids}) == 3
    assert sample_counter((ids, ids), "auto")((ids, ids)) == 3
    assert sample_counter(ids, "auto")(ids) == 3
    assert sample_counter({"inputs": [1, 2]}, "auto")({"inputs": [1, 2]}) == 2
    assert sample_counter({"meta": "x"}, "auto") is None
    assert token_counter({"input_ids": ids}, "auto")({"input_ids": ids}) == 15
    batch = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 0, 0, 0]] * 3)}
    assert int(token_counter(batch, "auto")(batch)) == 6
    assert token_counter({"n_tok": 7}, "n_tok")({"n_tok": 7}) == 7
    assert token_counter({"inputs": ids}, "auto") is None


def test_world_size_scales_run_rates_not_mfu():
    meter = ThroughputMeter(flops_per_token=10.0, peak_tflops=1e-9)
    meter.start(nn.Linear(1, 1), torch.device("cpu"), world_size=4)
    from distributed_runner.engine.message_hub import MessageHub
    hub = MessageHub()
    batch = {"input_ids": torch.zeros(2, 5, dtype=torch.long)}
    meter.record(hub, batch, 0.5)
    assert hub.get_scalar("train/samples_per_s").mean() == pytest.approx(2 * 4 / 0.5)
    assert hub.get_scalar("train/tokens_per_s").mean() == pytest.approx(10 * 4 / 0.5)
    assert hub.get_scalar("train/mfu").mean() == pytest.approx(10 / 0.5 * 10 / 1e3)


def test_a_batch_that_cannot_be_counted_records_nothing_and_ends_the_counting(caplog):
    """Counted from the first batch on; a later batch without the tokens' key writes neither
    rate for its step (the samples are not half-recorded) and the meter stops with a warning."""
    meter = ThroughputMeter()
    meter.start(nn.Linear(1, 1), torch.device("cpu"), world_size=1)
    from distributed_runner.engine.message_hub import MessageHub
    hub = MessageHub()
    ids = torch.zeros(2, 5, dtype=torch.long)
    meter.record(hub, {"inputs": torch.zeros(2, 3), "input_ids": ids}, 0.5)
    meter.record(hub, {"inputs": torch.zeros(2, 3)}, 0.25)  # samples countable, tokens not
    meter.record(hub, {"inputs": torch.zeros(2, 3), "input_ids": ids}, 0.5)
    samples, tokens = hub.get_scalar("train/samples_per_s"), hub.get_scalar("train/tokens_per_s")
    assert len(samples) == len(tokens) == 1
    assert "cannot count this batch" in caplog.text


def test_micro_batches_are_counted_each_and_a_weight_0_pass_not_at_all(caplog):
    """A step of several micro-batches (an elastic step's, or a StreamingLoader's weighted last
    global batch beside plain steps) counts the samples and tokens of each, not the number of
    micro-batches or of their keys; a weight-0 pass that pads a short share trains no sample."""
    from distributed_runner.data.global_batch import MicroBatches
    from distributed_runner.engine.message_hub import MessageHub

    def part(rows):
        return {"inputs": torch.zeros(rows, 3), "input_ids": torch.zeros(rows, 5, dtype=torch.long)}

    record = ThroughputMeter()
    record.start(nn.Linear(1, 1), torch.device("cpu"), world_size=1)
    hub = MessageHub()
    for batch in (part(4), MicroBatches([part(3), part(1)], [1.5, 0.0]), part(4)):
        record.record(hub, batch, 0.5, timer_module.trained_parts(batch))
    assert hub.get_scalar("train/samples_per_s").values() == pytest.approx([8.0, 6.0, 8.0])
    assert hub.get_scalar("train/tokens_per_s").values() == pytest.approx([40.0, 30.0, 40.0])
    assert "cannot count" not in caplog.text

    grouped = ThroughputMeter()  # an elastic run: MicroBatches from its first step
    grouped.start(nn.Linear(1, 1), torch.device("cpu"), world_size=1)
    hub = MessageHub()
    batch = MicroBatches([part(2), part(2)])
    grouped.record(hub, batch, 0.5, timer_module.trained_parts(batch))
    assert hub.get_scalar("train/samples_per_s").values() == pytest.approx([8.0])
    assert timer_module.trained_parts(part(2)) is None


def test_a_tensor_parallel_group_counts_its_batches_once_and_each_rank_its_share_of_flops():
    """tp=2 on 4 ranks: 2 groups read data, each rank of a group does half of every matmul."""
    from distributed_runner.engine.message_hub import MessageHub
    meter = ThroughputMeter(flops_per_token=10.0, peak_tflops=1e-9)
    meter.start(nn.Linear(1, 1), torch.device("cpu"), world_size=4, tensor_parallel=2)
    hub = MessageHub()
    meter.record(hub, {"input_ids": torch.zeros(2, 5, dtype=torch.long)}, 0.5)
    assert hub.get_scalar("train/samples_per_s").mean() == pytest.approx(2 * 2 / 0.5)
    assert hub.get_scalar("train/tokens_per_s").mean() == pytest.approx(10 * 2 / 0.5)
    assert hub.get_scalar("train/mfu").mean() == pytest.approx(10 / 0.5 * 10 / 1e3 / 2)
