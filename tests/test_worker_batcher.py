"""The live batcher shell, with a cheap runner: rule, config changes, OOM split, deadlines."""

import asyncio
import time

import pytest

from adaptive.config import BatchConfig
from server.worker.batching import DeadlineExceeded, DynamicBatcher, QueueFull
from server.worker.runner import OutOfMemory


class EchoRunner:
    """Returns each input doubled after base + per-item seconds; records batch sizes."""

    def __init__(self, base_s=0.002, per_item_s=0.0, fits=None):
        self.base_s, self.per_item_s, self.fits = base_s, per_item_s, fits
        self.batches: list[list[int]] = []
        self.warmed: list[int] = []

    def run(self, inputs, padded_size):
        if self.fits is not None and len(inputs) > self.fits:
            raise OutOfMemory(f"{len(inputs)} do not fit")
        time.sleep(self.base_s + self.per_item_s * padded_size)
        self.batches.append(list(inputs))
        return [2 * x for x in inputs]

    def warm(self, size):
        self.warmed.append(size)
        return 0.001


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_full_batches_go_at_once_and_outputs_match_inputs():
    async def scenario():
        runner = EchoRunner()
        batcher = DynamicBatcher(runner, BatchConfig(8, 5.0))  # only full batches leave early
        await batcher.start()
        while batcher.warming:
            await asyncio.sleep(0.01)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(16)))
        await batcher.drain()
        return runner, results

    runner, results = run(scenario())
    assert [r.output for r in results] == [2 * i for i in range(16)]
    assert runner.batches == [list(range(8)), list(range(8, 16))]
    assert runner.warmed == [1, 2, 4, 8]
    assert all(r.batch_size == 8 and r.padded_size == 8 for r in results)


def test_config_change_mid_load_loses_duplicates_and_reorders_nothing():
    async def scenario():
        runner = EchoRunner(base_s=0.001)
        batcher = DynamicBatcher(runner, BatchConfig(4, 0.002))
        await batcher.start()
        tasks = []
        for i in range(300):
            tasks.append(asyncio.create_task(batcher.submit(i)))
            if i % 50 == 25:
                batcher.reconfigure(BatchConfig(1 + (i % 7) * 5, 0.001 * (i % 3)))
            await asyncio.sleep(0.0002)
        results = await asyncio.gather(*tasks)
        await batcher.drain()
        return runner, results

    runner, results = run(scenario())
    assert [r.output for r in results] == [2 * i for i in range(300)]
    served = [x for batch in runner.batches for x in batch]
    assert served == list(range(300))  # FIFO, once each


def test_out_of_memory_splits_until_it_runs_and_lowers_the_cap():
    async def scenario():
        runner = EchoRunner(fits=4)
        batcher = DynamicBatcher(runner, BatchConfig(16, 1.0), warm_at_start=False)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(i) for i in range(16)))
        await batcher.drain()
        return runner, batcher, results

    runner, batcher, results = run(scenario())
    assert [r.output for r in results] == [2 * i for i in range(16)]
    assert batcher.stats.oom_splits == 3  # 16 -> 8+8 -> 4+4+4+4
    assert batcher.accepted_cap == 4 and batcher.serving_cap == 4
    assert max(len(b) for b in runner.batches) == 4


def test_bounded_queue_sheds_and_deadline_expires_in_the_queue():
    async def scenario():
        batcher = DynamicBatcher(
            EchoRunner(), BatchConfig(64, 0.3), max_queue=3, warm_at_start=False
        )
        await batcher.start()
        late = asyncio.create_task(batcher.submit(0, deadline_s=0.05))
        kept = [asyncio.create_task(batcher.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull):
            await batcher.submit(3)
        with pytest.raises(DeadlineExceeded):
            await late
        outputs = [r.output for r in await asyncio.gather(*kept)]
        await batcher.drain()
        return batcher, outputs

    batcher, outputs = run(scenario())
    assert outputs == [2, 4]
    assert batcher.stats.shed == 1 and batcher.stats.expired == 1


def test_raising_the_cap_serves_the_old_cap_until_warm():
    async def scenario():
        runner = EchoRunner()
        batcher = DynamicBatcher(runner, BatchConfig(4, 0.0), warm_at_start=False)
        await batcher.start()
        batcher.reconfigure(BatchConfig(32, 0.0))
        caps = [batcher.serving_cap]
        while batcher.warming:
            await asyncio.sleep(0.001)
        caps.append(batcher.serving_cap)
        await batcher.drain()
        return runner, caps

    runner, caps = run(scenario())
    assert caps == [4, 32]
    assert runner.warmed == [8, 16, 32]


def test_compiled_buckets_warm_slowly_once_and_answer_like_eager():
    import torch

    from server.worker.models import load_model
    from server.worker.runner import TorchRunner

    model = load_model("demo-cnn")
    eager = TorchRunner(model)
    compiled = TorchRunner(load_model("demo-cnn"), compile=True)
    warm_s = compiled.warm(2)
    inputs = [model.validate(model.example(i)) for i in range(2)]
    started = time.perf_counter()
    outputs = compiled.run(inputs, 2)
    assert warm_s > 10 * (time.perf_counter() - started)  # compiling costs, running does not
    expected = torch.tensor(eager.run(inputs, 2))
    assert torch.allclose(torch.tensor(outputs), expected, atol=1e-4)


def test_torchscript_files_and_user_factories_load_and_run(tmp_path):
    import torch

    from server.worker.models import load_model
    from server.worker.runner import TorchRunner
    from tidal_base.errors import InvalidInput

    factory = load_model("tests.fixtures.user_model:build")
    expected = factory.module(torch.ones(2, 4)).tolist()
    assert TorchRunner(factory).run([factory.validate([1.0] * 4)] * 2, 2) == expected
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(factory.module), path)
    scripted = load_model(str(path))
    outputs = TorchRunner(scripted).run([scripted.validate([1.0] * 4)], 4)
    assert outputs == [expected[0]]  # padded to 4, answered for 1
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(
        factory.module, (torch.ones(2, 4),), dynamic_shapes={"input": {0: batch}}
    )
    torch.export.save(exported, tmp_path / "model.pt2")
    program = load_model(str(tmp_path / "model.pt2"))
    assert TorchRunner(program).run([program.validate([1.0] * 4)], 2) == [expected[0]]
    with pytest.raises(InvalidInput, match="unknown model"):
        load_model("no-such-model")
    bogus = tmp_path / "bogus.pt"
    bogus.write_text("not a model")
    with pytest.raises(InvalidInput, match="not a TorchScript file"):
        load_model(str(bogus))


def test_instances_run_batches_concurrently():
    async def scenario():
        runner = EchoRunner(base_s=0.05)
        batcher = DynamicBatcher(runner, BatchConfig(1, 0.0), instances=4, warm_at_start=False)
        await batcher.start()
        started = time.perf_counter()
        await asyncio.gather(*(batcher.submit(i) for i in range(8)))
        elapsed = time.perf_counter() - started
        await batcher.drain()
        return elapsed

    assert run(scenario()) < 0.05 * 8 / 2  # four at a time: about 0.1 s, not 0.4 s
