"""The save-against-limit report: ratios of medians, the faster method as the limit."""

from __future__ import annotations

from benchmarks.against_limit import METHODS, OURS, REPLAY, report

ONE, TWO = METHODS


def test_the_ratio_is_the_faster_methods_median_over_ckptstores() -> None:
    times = {OURS: [0.50, 0.40, 0.60], ONE: [0.30, 0.50, 0.40], TWO: [0.90, 0.20, 1.00]}
    lines = report(times, 1 << 30)
    assert "| median | 0.500 | 0.400 | 0.900 |" in lines
    verdict = next(line for line in lines if line.startswith("| save >= 0.85x"))
    assert f"the limit: {ONE}" in verdict
    assert verdict.endswith("| NO | 0.80x |")
    best = next(line for line in lines if line.startswith("| the same, best round"))
    assert best.endswith("| NO | 0.50x |")  # 0.20 s against 0.40 s


def test_a_save_as_fast_as_the_limit_meets_the_target() -> None:
    times = {OURS: [0.45, 0.47], ONE: [0.40, 0.40], TWO: [0.41, 0.42]}
    verdict = next(line for line in report(times, 1 << 30) if "0.85x" in line)
    assert "| yes | 0.87x |" in verdict


def test_the_ratio_is_taken_apart_into_the_layout_and_the_process() -> None:
    times = {OURS: [0.50, 0.52], ONE: [0.40, 0.40], TWO: [0.42, 0.44], REPLAY: [0.45, 0.43]}
    lines = report(times, 1 << 30)
    assert f"| {REPLAY} s |" in lines[0]
    layout = next(line for line in lines if line.startswith("| the layout:"))
    assert layout.endswith("| 0.91x |")  # the limit's 0.40 s against the replay's 0.44
    process = next(line for line in lines if line.startswith("| the process:"))
    assert process.endswith("| 0.86x |")  # the replay's 0.44 s against the save's 0.51


def test_without_a_replay_the_ratio_is_not_taken_apart() -> None:
    times = {OURS: [0.50], ONE: [0.40], TWO: [0.42]}
    assert not any("taken apart" in line for line in report(times, 1 << 30))
