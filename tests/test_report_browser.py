"""The report in a real browser (Debian's headless Chromium through Playwright): what a person sees.

Checked on pages of real run directories written by the evaluator: the numbers equal ``summary.json``, filters
change which episodes are shown, an episode's video plays (its ``readyState`` advances), its trajectory plot
appears, the A/B section shows paired counts and side-by-side videos, there are no console errors and no
request leaves the file system.
"""

from __future__ import annotations

import json

import pytest
from report_runs import FailOnSeed, replicated_run, toy_ab_run, toy_arms_run, toy_run

from dz_gym.eval.control import RunControl
from dz_gym.report import write_report
from dz_gym.stats.comparison import compare_rows

pytest_plugins = ["browser"]  # the browser and open_page fixtures (tests/browser.py)
pytestmark = pytest.mark.timeout(240)


def rate_shown(entry) -> str:
    """How a person reads a success rate on the page, written independently of the page code."""
    lo, hi = entry["ci95"]
    return f"{entry['k']}/{entry['n']} {100 * entry['rate']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def visible_keys(page) -> list[str]:
    return page.eval_on_selector_all(
        "#episodes tr.ep", "rows => rows.filter(r => r.offsetParent !== null).map(r => r.dataset.key)"
    )


def assert_clean(watch) -> None:
    assert watch.errors == []
    assert watch.foreign_requests() == []
    assert watch.requests and all(url.startswith("file://") for url in watch.requests)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = toy_run(tmp_path_factory.mktemp("toy"))
    write_report(run_dir.path)
    return run_dir


def test_numbers_equal_summary_json(run, open_page):
    page, watch = open_page(run.path / "report.html")
    summary = json.loads((run.path / "summary.json").read_text())
    assert page.inner_text("#run-state").strip() == "complete"
    for key in ["1", "2", "overall"]:
        row = f'#results-table tr[data-scene="{key}"]'
        for field in ("success_at_end", "success_any_step"):
            shown = " ".join(page.inner_text(f'{row} td[data-field="{field}"]').split())
            assert shown == rate_shown(summary[key][field]), (key, field)
        assert page.inner_text(f'{row} td[data-field="errored"]') == str(summary[key]["errored"])
        assert page.inner_text(f'{row} td[data-field="server_calls"]') == str(summary[key]["server_calls"])
        assert (
            page.inner_text(f'{row} td[data-field="episodes"]')
            == f"{summary[key]['episodes']} / {summary[key]['planned']}"
        )
    assert "toy run for the report tests" in page.inner_text("#run")
    errors = page.inner_text("ul.errors")
    assert errors.count("scene") == summary["overall"]["errored"] == 2 and "server_error" in errors
    lat = summary["latency_ms"]
    histogram = page.text_content("#plot-latency")
    for key in ("p50", "p90", "p99"):
        assert f"{key} {lat[key]:.0f}" in histogram
    assert_clean(watch)


def test_filters_change_the_episodes_shown(run, open_page):
    page, watch = open_page(run.path / "report.html")
    rows = run.read_rows()
    assert len(visible_keys(page)) == len(rows) == 12
    page.select_option("#f-outcome", "errored")
    errored = sorted(f"scene{r['scene']}_ep{r['episode']:04d}" for r in rows if r["error"] is not None)
    assert sorted(visible_keys(page)) == errored and len(errored) == 2
    page.select_option("#f-outcome", "success")
    assert sorted(visible_keys(page)) == sorted(
        f"scene{r['scene']}_ep{r['episode']:04d}" for r in rows if r["success_at_end"]
    )
    page.select_option("#f-scene", "2")
    expected = sorted(f"scene2_ep{r['episode']:04d}" for r in rows if r["success_at_end"] and r["scene"] == 2)
    assert sorted(visible_keys(page)) == expected and expected
    assert page.inner_text("#shown-count") == f"showing {len(expected)} of 12 episodes"
    page.select_option("#f-outcome", "failure")
    page.select_option("#f-scene", "")
    assert sorted(visible_keys(page)) == sorted(
        f"scene{r['scene']}_ep{r['episode']:04d}" for r in rows if r["error"] is None and not r["success_at_end"]
    )
    assert_clean(watch)


def test_video_plays_and_trajectory_is_drawn(run, open_page):
    page, watch = open_page(run.path / "report.html")
    playable = page.evaluate("document.createElement('video').canPlayType('video/mp4; codecs=\"avc1.42E01E\"')")
    assert playable in ("probably", "maybe"), "this Chromium cannot play H.264 mp4 (Debian's build can)"
    assert page.locator("video").count() == 0  # nothing loads before an episode is opened
    row = run.read_rows()[0]
    key = f"scene{row['scene']}_ep{row['episode']:04d}"
    page.click(f'#episodes tr[data-key="{key}"] button.open')
    video = f'tr.detail[data-for="{key}"] video'
    page.wait_for_selector(video)
    page.eval_on_selector(video, "v => v.play()")
    page.wait_for_function(
        f"(() => {{ const v = document.querySelector('{video}'); return v.readyState >= 2 && v.currentTime > 0; }})()",
        timeout=20_000,
    )
    assert page.eval_on_selector(video, "v => v.error") is None
    traj = f'tr.detail[data-for="{key}"] svg.traj'
    assert page.locator(f"{traj} polyline").count() == 7 + 1  # joints + gripper
    assert page.locator(f"{traj} line.call").count() == row["server_calls"]
    page.click(f'#episodes tr[data-key="{key}"] button.open')  # closes again
    assert page.locator("tr.detail").count() == 0
    # A failure mode's fold-out makes its episodes' videos only when asked for.
    mode = f'details.mode[data-mode="{row["failure_mode"]}"]'
    page.click(f"{mode} summary")
    page.click(f"{mode} button.modeopen")
    same = sum(r["failure_mode"] == row["failure_mode"] for r in run.read_rows())
    assert page.locator(f"{mode} video").count() == min(same, 12)
    page.click(f"{mode} button.modeopen")
    assert page.locator("video").count() == 0
    assert_clean(watch)


def test_without_videos_and_in_progress(tmp_path, open_page):
    run_dir = toy_run(tmp_path, scenes=(1,), episodes=4, num_envs=2, max_steps=6, video=False, fail_seed=None)
    (run_dir.path / "summary.json").unlink()  # as if the run were still going
    path = write_report(run_dir.path)
    page, watch = open_page(path)
    assert page.inner_text("#run-state").strip() == "in progress"
    assert page.is_visible("#recomputed") and page.is_visible("#no-videos")
    page.click("#episodes tr.ep button.open")
    assert "--no-video" in page.inner_text("tr.detail .novideo")
    assert page.locator("tr.detail svg.traj").count() == 1
    assert_clean(watch)


def test_two_runs_compared(tmp_path, open_page):
    # Same seeds; seeds with seed % 3 == 1 succeed at the end only in 4-step episodes (the toy env's rule). The
    # step limits differ, so the runs are not comparable: the page is forced, says why and draws no verdict.
    run_a = toy_run(tmp_path / "a", scenes=(1,), episodes=6, num_envs=3, max_steps=12, fail_seed=None)
    run_b = toy_run(tmp_path / "b", scenes=(1,), episodes=6, num_envs=3, max_steps=4, fail_seed=5)
    path = write_report(run_a.path, run_b.path, out_dir=tmp_path / "ab", force=True)
    page, watch = open_page(path)
    assert page.is_visible("#paired-not-comparable") and "max steps differs" in page.inner_text("#compare")
    expected = compare_rows(run_a.read_rows(), run_b.read_rows())["scenes"]["overall"]
    assert (expected["pairs"], expected["b_only"], expected["a_only"]) == (5, 2, 0)
    cells = page.eval_on_selector_all('#paired tr[data-scope="overall"] td', "tds => tds.map(t => t.innerText)")
    assert cells[:5] == [str(expected[k]) for k in ("pairs", "both", "a_only", "b_only", "neither")]
    low, high = expected["diff_range"]  # B's errored episode (seed 5): B - A's range over its outcomes
    assert expected["errored_pairs"] == 1 and cells[7].startswith(f"{100 * low:+.1f}..{100 * high:+.1f} pts")
    assert cells[8] == f"{expected['p_value']:.3g}"
    pairs = page.locator("#discordant li.pair")
    assert pairs.count() == 2
    pairs.first.locator("button.pairopen").click()
    videos = pairs.first.locator("video")
    assert videos.count() == 2
    page.wait_for_function(
        "Array.from(document.querySelectorAll('#discordant video')).every(v => v.readyState >= 1)", timeout=20_000
    )
    page.select_option("#f-run", "B")
    assert len(visible_keys(page)) == 6 and all(k.startswith("b:") for k in visible_keys(page))
    assert_clean(watch)


def test_evaluator_writes_the_report_after_a_stop_and_on_resume(tmp_path, open_page):
    control = RunControl()
    control.on_row = lambda row: control.stop.set() if control.rows_written >= 2 else None
    run_dir = toy_run(tmp_path, scenes=(1,), episodes=6, num_envs=2, max_steps=8, fail_seed=None, control=control)
    page, watch = open_page(run_dir.path / "report.html")  # written by the evaluator, not by this test
    assert page.inner_text("#run-state").strip() == "interrupted"
    done = len(run_dir.read_rows())
    assert 2 <= done < 6 and page.inner_text("#shown-count") == f"showing {done} of {done} episodes"
    assert_clean(watch)
    toy_run(tmp_path, scenes=(1,), episodes=6, num_envs=2, max_steps=8, fail_seed=None, run_dir=run_dir)
    page, watch = open_page(run_dir.path / "report.html")
    assert page.inner_text("#run-state").strip() == "complete"
    assert page.inner_text("#shown-count") == "showing 6 of 6 episodes"
    assert_clean(watch)


def test_ab_run(tmp_path, open_page):
    run_dir = toy_ab_run(tmp_path)
    summary = json.loads((run_dir.path / "summary.json").read_text())
    page, watch = open_page(run_dir.path / "report.html")  # written by the evaluator
    for arm in ("a", "b"):
        for key in ["1", "overall"]:
            cell = f'#results-table-arm-{arm} tr[data-scene="{key}"] td[data-field="success_at_end"]'
            assert " ".join(page.inner_text(cell).split()) == rate_shown(summary["arms"][arm][key]["success_at_end"])
    expected = summary["comparison"]["scenes"]["overall"]
    assert (expected["pairs"], expected["errored_pairs"]) == (3, 1)
    cells = page.eval_on_selector_all('#paired tr[data-scope="overall"] td', "tds => tds.map(t => t.innerText)")
    assert cells[:5] == [str(expected[k]) for k in ("pairs", "both", "a_only", "b_only", "neither")]
    assert cells[8] == f"{expected['p_value']:.3g}"
    page.select_option("#f-run", "B")
    page.select_option("#f-outcome", "errored")
    assert visible_keys(page) == ["b:scene1_ep0002"]
    assert_clean(watch)


def test_named_arms_leaderboard_and_a_neighbour_pair_side_by_side(tmp_path, open_page):
    from dz_gym.server.policies import HoldPolicy

    policies = {"x": HoldPolicy(gripper=1.0), "y": HoldPolicy(), "z": FailOnSeed(1, gripper=1.0)}
    run_dir = toy_arms_run(tmp_path, policies, episodes=4)
    ranking = json.loads((run_dir.path / "summary.json").read_text())["ranking"]["arms"]
    page, watch = open_page(write_report(run_dir.path))
    shown = page.eval_on_selector_all("#leaderboard tbody tr", "rows => rows.map(r => r.dataset.arm)")
    assert shown == [e["arm"] for e in ranking]
    upper, lower = shown[1], shown[2]  # a closing arm and y: every seed both completed is discordant
    pairs = page.locator(f"#discordant-{upper}-{lower} li.pair")
    assert pairs.count() >= 3
    pairs.first.locator("button.pairopen").click()
    captions = pairs.first.locator("figcaption")
    assert [captions.nth(i).inner_text() for i in range(captions.count())] == [upper, lower]
    page.wait_for_function(
        f"Array.from(document.querySelectorAll('#discordant-{upper}-{lower} video')).every(v => v.readyState >= 1)",
        timeout=20_000,
    )
    assert_clean(watch)


def test_many_episodes_are_all_listed_and_filtered(run, tmp_path, open_page):
    big = replicated_run(run, tmp_path / "big", 250)  # more rows than the script builds before the first paint
    path = write_report(big.path)
    page, watch = open_page(path)
    rows = big.read_rows()
    assert len(visible_keys(page)) == 250 and page.inner_text("#shown-count") == "showing 250 of 250 episodes"
    page.select_option("#f-outcome", "failure")
    expected = sorted(f"scene1_ep{r['episode']:04d}" for r in rows if r["error"] is None and not r["success_at_end"])
    assert sorted(visible_keys(page)) == expected
    last = expected[-1]
    page.click(f'#episodes tr[data-key="{last}"] button.open')
    page.wait_for_selector(f'tr.detail[data-for="{last}"] video')
    assert page.locator(f'tr.detail[data-for="{last}"] svg.traj').count() == 1
    assert_clean(watch)
