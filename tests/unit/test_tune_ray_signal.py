"""The Ray trial's signal actor's protocol, run on a plain event loop (no Ray): reports keyed by
iteration (a restarted worker group's repeats are dropped), holds, and a stop that frees them."""
import asyncio

from distributed_runner.tune.ray_trial_signal import TrialSignal


def test_reports_hold_until_released_and_a_stop_frees_every_waiter():
    async def scenario():
        signal = TrialSignal()
        assert await signal.put_report(45, {"epoch": 1}, "/w/epoch_1.pth")
        held = [asyncio.create_task(signal.wait_released(45)) for _ in range(2)]  # two ranks
        assert await signal.take_report() == (45, {"epoch": 1}, "/w/epoch_1.pth")
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in held)  # held until the trial lets the run go on
        await signal.release(45)
        assert await asyncio.gather(*held) == [None, None]
        # a restarted worker group repeats iterations from its checkpoint: not reported twice,
        # not held again
        assert not await signal.put_report(45, {"epoch": 1}, "/w/epoch_1.pth")
        assert await asyncio.wait_for(signal.wait_released(45), 1) is None
        assert await signal.put_report(90, {"epoch": 2}, "/w/epoch_2.pth")
        held = asyncio.create_task(signal.wait_released(90))
        watching = asyncio.create_task(signal.wait_stop())
        await asyncio.sleep(0.05)
        assert not held.done() and not watching.done()
        await signal.stop("tune: stopped")
        await signal.stop("tune: a second reason")  # the first one wins
        assert await held == "tune: stopped" and await watching == "tune: stopped"
        # after a stop nothing holds any more
        assert await asyncio.wait_for(signal.wait_released(135), 1) == "tune: stopped"

    asyncio.run(scenario())
