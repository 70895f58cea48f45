"""Batch assembly of the encoder worker's dynamic batcher: when a batch is released and what
goes in it (size cap, wait cap from the SLO, deadline first, length grouping, error isolation).

BatchQueue is pure (the clock is passed in); DynamicBatcher is run with a fake compute.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.workers.encoder.batcher import (
    BatchPolicy,
    BatchQueue,
    DynamicBatcher,
    Job,
    length_bucket,
)
from runtime.workers.encoder.cost import ComputeModel

pytestmark = pytest.mark.unit


def fixed_cost(fixed: float = 0.001, per_token: float = 0.0) -> ComputeModel:
    return ComputeModel(prior_fixed_s=fixed, prior_per_token_s=per_token)


def job(length: int, *, at: float = 0.0, deadline: float = 100.0, task: str = "embed") -> Job:
    return Job(task=task, ids=[1] * length, deadline=deadline, enqueued=at)


def test_size_cap_releases_at_once():
    queue = BatchQueue(BatchPolicy(max_batch=4, max_wait_s=1.0), fixed_cost())
    for _ in range(3):
        queue.add(job(8))
    assert queue.take(0.0) is None
    queue.add(job(8))
    batch = queue.take(0.0)
    assert batch is not None
    assert (len(batch.jobs), batch.reason) == (4, "size")
    assert len(queue) == 0


def test_size_cap_bounds_the_batch_and_keeps_the_rest():
    queue = BatchQueue(BatchPolicy(max_batch=4, max_wait_s=1.0), fixed_cost())
    for _ in range(6):
        queue.add(job(8))
    batch = queue.take(0.0)
    assert batch is not None
    assert len(batch.jobs) == 4
    assert len(queue) == 2


def test_wait_cap_releases_a_partial_batch():
    queue = BatchQueue(BatchPolicy(max_batch=8, max_wait_s=0.010, slo_s=10.0), fixed_cost())
    queue.add(job(8, at=0.0))
    queue.add(job(8, at=0.004))
    assert queue.next_release() == pytest.approx(0.010)
    assert queue.take(0.009) is None
    batch = queue.take(0.010)
    assert batch is not None
    assert (len(batch.jobs), batch.reason) == (2, "wait")


def test_wait_cap_is_bounded_by_slo_minus_compute_minus_margin():
    # SLO 50 ms, a full batch computes in 30 ms, margin 5 ms: W = 15 ms although max_wait is 1 s
    policy = BatchPolicy(max_batch=8, max_wait_s=1.0, slo_s=0.050, margin_s=0.005)
    queue = BatchQueue(policy, fixed_cost(fixed=0.030))
    assert queue.wait_cap(16) == pytest.approx(0.015)
    # at the group's size: a smaller batch computes faster, so it may wait longer
    sized = BatchQueue(policy, fixed_cost(fixed=0.010, per_token=0.001))
    assert sized.wait_cap(16, 1) == pytest.approx(min(1.0, 0.050 - (0.010 + 0.016) - 0.005))
    assert sized.wait_cap(16, 2) == pytest.approx(0.003)
    assert sized.wait_cap(16, 3) == 0.0  # 0.010 + 0.048 + 0.005 > 0.050
    # an SLO the compute alone exceeds: no waiting at all
    tight = BatchQueue(BatchPolicy(max_batch=8, slo_s=0.020), fixed_cost(fixed=0.030))
    assert tight.wait_cap(16) == 0.0


def test_earliest_deadline_releases_before_the_wait_cap():
    policy = BatchPolicy(max_batch=8, max_wait_s=0.100, slo_s=10.0, margin_s=0.005)
    queue = BatchQueue(policy, fixed_cost(fixed=0.010))
    queue.add(job(8, at=0.0, deadline=5.0))
    queue.add(job(8, at=0.0, deadline=0.050))  # due at 0.050 - 0.010 - 0.005 = 0.035
    assert queue.next_release() == pytest.approx(0.035)
    assert queue.take(0.034) is None
    batch = queue.take(0.035)
    assert batch is not None
    assert batch.reason == "deadline"
    assert len(batch.jobs) == 2


def test_within_a_batch_earliest_deadline_goes_first():
    queue = BatchQueue(BatchPolicy(max_batch=2, max_wait_s=1.0), fixed_cost())
    late, early, middle = job(8, deadline=9.0), job(8, deadline=1.0), job(8, deadline=5.0)
    for item in (late, early, middle):
        queue.add(item)
    batch = queue.take(0.0)
    assert batch is not None
    assert batch.jobs == (early, middle)


def test_the_most_overdue_group_goes_first():
    queue = BatchQueue(BatchPolicy(max_batch=8, max_wait_s=0.010, slo_s=10.0), fixed_cost())
    queue.add(job(200, at=0.002))
    queue.add(job(8, at=0.0))
    batch = queue.take(1.0)
    assert batch is not None
    assert batch.seq_len == 8


def test_length_grouping_keeps_short_inputs_apart_from_long_ones():
    queue = BatchQueue(BatchPolicy(max_batch=4, max_wait_s=1.0), fixed_cost())
    for length in (5, 200, 7, 190, 9, 250, 12):
        queue.add(job(length))
    batch = queue.take(0.0)
    assert batch is not None
    assert sorted(len(j.ids) for j in batch.jobs) == [5, 7, 9, 12]
    assert batch.seq_len == 12  # padded to 12 tokens, not 250


def test_tasks_never_share_a_batch():
    queue = BatchQueue(BatchPolicy(max_batch=2, max_wait_s=1.0), fixed_cost())
    queue.add(job(8, task="embed"))
    queue.add(job(8, task="classify"))
    assert queue.take(0.0) is None  # neither group is full


def test_batching_off_releases_every_job_alone_at_once():
    queue = BatchQueue(BatchPolicy(max_batch=8, enabled=False), fixed_cost())
    for _ in range(3):
        queue.add(job(8))
    batch = queue.take(0.0)
    assert batch is not None
    assert (len(batch.jobs), batch.reason) == (1, "off")


def test_length_bucket():
    assert [length_bucket(n) for n in (1, 16, 17, 33, 256)] == [16, 16, 32, 64, 256]


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(
            st.floats(0, 0.05),  # arrival
            st.integers(1, 300),  # length
            st.floats(0.01, 1.0),  # SLO of the request
        ),
        min_size=1,
        max_size=40,
    ),
    max_batch=st.integers(1, 8),
)
def test_property_every_job_is_released_once_within_its_budget(arrivals, max_batch):
    """Each job leaves exactly once, in a batch of at most max_batch of one length bucket, and
    no later than its wait cap or its deadline minus the predicted compute of its batch minus
    the margin (or the arrival of its batch's last job, if that came after)."""
    policy = BatchPolicy(max_batch=max_batch, max_wait_s=0.010, slo_s=1.0, margin_s=0.002)
    cost = fixed_cost(fixed=0.001, per_token=1e-6)
    queue = BatchQueue(policy, cost)
    jobs = sorted(
        (Job(task="embed", ids=[1] * n, deadline=t + slo, enqueued=t) for t, n, slo in arrivals),
        key=lambda j: j.enqueued,
    )
    released: dict[int, float] = {}
    shape: dict[int, tuple[int, int, float]] = {}  # job -> (size, length, last arrival)
    now, pending = 0.0, list(jobs)
    for _ in range(10_000):
        while pending and pending[0].enqueued <= now:
            queue.add(pending.pop(0))
        while (batch := queue.take(now)) is not None:
            assert 1 <= len(batch.jobs) <= max_batch
            assert len({length_bucket(len(j.ids)) for j in batch.jobs}) == 1
            last = max(j.enqueued for j in batch.jobs)
            for item in batch.jobs:
                assert id(item) not in released
                released[id(item)] = now
                shape[id(item)] = (len(batch.jobs), batch.seq_len, last)
        if not pending and len(queue) == 0:
            break
        candidates = [t for t in (queue.next_release(),) if t is not None]
        if pending:
            candidates.append(pending[0].enqueued)
        now = max(now, min(candidates))
    assert len(released) == len(jobs)
    for item in jobs:
        size, seq_len, last = shape[id(item)]
        bound = item.enqueued + queue.wait_cap(length_bucket(len(item.ids)), size)
        bound = min(bound, item.deadline - cost.predict(size, seq_len) - policy.margin_s)
        # a job arriving after its group fell due makes it due at once
        assert released[id(item)] <= max(bound, last) + 1e-9


def test_compute_model_learns_a_linear_cost():
    model = ComputeModel()
    for n, length in ((1, 16), (8, 16), (1, 64), (8, 64), (4, 32)):
        model.observe(n, length, 0.002 + 1e-5 * n * length)
    a, b = model.coefficients()
    assert a == pytest.approx(0.002, rel=0.05)
    assert b == pytest.approx(1e-5, rel=0.05)
    assert model.predict(16, 128) == pytest.approx(0.002 + 1e-5 * 16 * 128, rel=0.05)


@pytest.mark.asyncio
async def test_batcher_groups_concurrent_requests_and_isolates_a_bad_input():
    calls: list[list[list[int]]] = []

    def run(task: str, batch: list[list[int]]) -> list[int]:
        calls.append(batch)
        if any(ids[0] < 0 for ids in batch):
            raise ValueError("negative token")
        return [sum(ids) for ids in batch]

    batcher = DynamicBatcher(run, policy=BatchPolicy(max_batch=4, max_wait_s=0.5, slo_s=5.0))
    batcher.start()
    try:
        good = [batcher.submit("embed", [i, 1]) for i in range(3)]
        bad = batcher.submit("embed", [-1, 1])
        results = await asyncio.wait_for(
            asyncio.gather(*good, bad, return_exceptions=True), timeout=10
        )
    finally:
        await batcher.stop()
    assert results[:3] == [1, 2, 3]
    assert isinstance(results[3], ValueError)
    assert len(calls[0]) == 4  # one batch of four (released on the size cap) ...
    assert sorted(len(c) for c in calls[1:]) == [1, 1, 1, 1]  # ... then each input alone


@pytest.mark.asyncio
async def test_batcher_off_computes_each_input_alone():
    sizes: list[int] = []

    def run(task: str, batch: list[list[int]]) -> list[int]:
        sizes.append(len(batch))
        return [0] * len(batch)

    batcher = DynamicBatcher(run, policy=BatchPolicy(max_batch=8, enabled=False))
    batcher.start()
    try:
        await asyncio.wait_for(batcher.submit_many("embed", [[1], [2], [3]]), timeout=10)
    finally:
        await batcher.stop()
    assert sizes == [1, 1, 1]


def test_a_class_slo_tightens_the_deadline_of_a_coalesced_request():
    from runtime.workers.encoder.server import EncoderService  # noqa: PLC0415

    far = time.monotonic() + 60
    tightened = EncoderService.within_slo(far, 200)
    assert tightened is not None
    assert tightened < far
    assert tightened - time.monotonic() <= 0.2
    assert EncoderService.within_slo(far, None) == far
    assert EncoderService.within_slo(far, True) == far
    assert EncoderService.within_slo(None, 0) is None
