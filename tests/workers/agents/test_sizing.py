"""The heuristic Main Agent sizes the next job from the last one's runtime and peak memory (issue 37)."""

from __future__ import annotations

from workers.agents.policies.search import size_next_job

GPU = {"index": 0, "memory_total_mib": 80_000.0}


def test_room_left_keeps_the_plan():
    summary = {"runtime_seconds": 60.0, "oom": False, "gpus": [{**GPU, "memory_mib": 40_000.0}]}
    changes, why = size_next_job(planned_steps=300, last_steps=200, last_hardware=summary,
                                 accelerator_left_seconds=3600, batch_size=64)  # fmt: skip
    assert changes == {}
    assert "as planned" in why


def test_a_slow_last_job_cuts_the_steps_to_a_third_of_what_is_left():
    summary = {"runtime_seconds": 200.0, "oom": False, "gpus": []}  # 1 s per step
    changes, why = size_next_job(planned_steps=300, last_steps=200, last_hardware=summary,
                                 accelerator_left_seconds=600, batch_size=64)  # fmt: skip
    assert changes == {"max_steps": 200}
    assert "1.00 s/step" in why
    tiny, _ = size_next_job(planned_steps=300, last_steps=200, last_hardware=summary,
                            accelerator_left_seconds=6, batch_size=64)  # fmt: skip
    assert tiny == {"max_steps": 10}


def test_an_oom_or_a_tight_peak_halves_the_batch():
    oom = {"runtime_seconds": 5.0, "oom": True, "gpus": []}
    assert size_next_job(planned_steps=10, last_steps=10, last_hardware=oom, accelerator_left_seconds=3600,
                         batch_size=64)[0] == {"batch_size": 32}  # fmt: skip
    tight = {"runtime_seconds": 5.0, "oom": False, "gpus": [{**GPU, "memory_mib": 76_000.0}]}
    changes, why = size_next_job(planned_steps=10, last_steps=10, last_hardware=tight, accelerator_left_seconds=3600,
                                 batch_size=1)  # fmt: skip
    assert changes == {"batch_size": 1}
    assert "90 %" in why
    assert size_next_job(planned_steps=10, last_steps=10, last_hardware=None, accelerator_left_seconds=1,
                         batch_size=8)[0] == {}  # fmt: skip
