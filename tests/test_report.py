"""Report v0 on the hand-written fixture results folder tests/fixtures/runs.

The fixture (all: model tiny, temperature 0, top_p 1, max_new_tokens 8, cpu, float32):
- ar_humaneval: AR on s0, s1, s2: 4, 5, 3 tokens in 0.4, 0.5, 0.3 s, with 3, 4, 2 one-token
  steps of 0.1 s.
- fake_humaneval: fake_method on s0, s1, s2 plus s3, which AR lacks. s0 and s2 match AR; s1 is
  [5, 6, 99, 8, 9] against AR's [5, 6, 7, 8, 9], so it diverges at index 2. Per sample:
  s0 4 tok/0.1 s, 1 step [3] of 4 drafted; s1 5 tok/0.25 s, steps [2, 2] of [3, 3];
  s2 3 tok/0.25 s, 1 step [2] of 3; s3 6 tok/0.1 s, 1 step [5] of 5. Step times sum to 0.45 s.
- fake_mtbench: fake_method on mt_bench (no AR run there), one sample with two turns.
Every summary.json stores stale metrics (throughput_total 999) that the report must ignore.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specbench.report import __main__ as cli
from specbench.report import compare, read, view

RUNS = Path(__file__).parent / "fixtures" / "runs"
REPO = Path(__file__).parent.parent


def _row(frame: pd.DataFrame, name: str) -> pd.Series:
    """The single row of the run whose folder is called name."""
    rows = frame[frame["run_dir"].map(lambda path: Path(path).name) == name]
    assert len(rows) == 1
    return rows.iloc[0]


def _copy_run(name: str, tmp_path: Path) -> Path:
    """A writable copy of one fixture run, to damage in a test."""
    return Path(shutil.copytree(RUNS / name, tmp_path / name))


def test_load_runs_walks_a_parent_folder():
    """A parent folder yields every run below it, with its identity columns."""
    runs = read.load_runs([RUNS])
    assert sorted(runs["method"]) == ["ar", "fake_method", "fake_method"]
    assert set(read.RUN_COLUMNS) <= set(runs.columns)
    ar = _row(runs, "ar_humaneval")
    assert (ar["temperature"], ar["top_p"], ar["seed"], ar["max_new_tokens"]) == (0.0, 1.0, 0, 8)
    assert (ar["device_name"], ar["dtype"], ar["n_samples"]) == ("cpu", "float32", 3)


def test_load_runs_accepts_run_dirs_and_counts_each_once():
    """Run dirs are accepted directly; a run named twice is one row."""
    runs = read.load_runs([RUNS / "ar_humaneval", RUNS])
    assert len(runs) == 3
    assert len(read.load_runs([RUNS / "fake_mtbench"])) == 1


def test_load_samples_has_one_row_per_record_with_identity():
    """Every (sample, turn) record is a row carrying its run's identity."""
    samples = read.load_samples([RUNS])
    assert len(samples) == 3 + 4 + 2
    counts = samples["run_dir"].map(lambda path: Path(path).name).value_counts()
    assert counts.to_dict() == {"fake_humaneval": 4, "ar_humaneval": 3, "fake_mtbench": 2}
    turns = samples[samples["dataset"] == "mt_bench"]
    assert list(turns["turn"]) == [0, 1] and set(turns["method"]) == {"fake_method"}


def test_metrics_are_recomputed_from_samples():
    """Metrics come from samples.jsonl (hand-computed), not the stale summary."""
    runs = read.load_runs([RUNS])
    fake = _row(runs, "fake_humaneval")
    assert fake["n_records"] == 4 and fake["new_tokens"] == 18
    assert fake["throughput_total"] == pytest.approx(18 / 0.7)  # not the stored 999
    assert fake["throughput_mean"] == pytest.approx((40 + 20 + 12 + 60) / 4)
    assert fake["tokens_per_step"] == pytest.approx((3 + 4 + 2 + 5) / 5)
    assert fake["accepted_per_step"] == pytest.approx(1.8)
    assert fake["draft_efficiency"] == pytest.approx((14 - 5) / (4 + 6 + 3 + 5))
    assert fake["step_latency_s"] == pytest.approx(0.45 / 5)
    assert fake["tokens_per_forward"] == pytest.approx(18 / (5 + 4))
    assert fake["outside_forward_share"] == pytest.approx(0.2)  # fixture verify_s = 0.8 * step_s
    ar = _row(runs, "ar_humaneval")
    assert ar["throughput_total"] == pytest.approx(12 / 1.2)
    assert ar["tokens_per_step"] == 1.0 and ar["accepted_per_step"] == 0.0
    assert math.isnan(ar["draft_efficiency"])  # AR drafts nothing
    turns = _row(runs, "fake_mtbench")
    assert turns["tokens_per_step"] == pytest.approx(1.5)
    assert turns["draft_efficiency"] == pytest.approx(0.25)


def test_overhead_is_step_latency_over_ar_step_latency():
    """Medusa's overhead: the run's mean step latency over its AR baseline's (0.09 s / 0.1 s)."""
    matched = compare.match_ar(read.load_runs([RUNS]))
    assert _row(matched, "fake_humaneval")["overhead"] == pytest.approx(0.09 / 0.1)
    assert _row(matched, "ar_humaneval")["overhead"] == pytest.approx(1.0)


def test_speedup_is_computed_on_common_samples_only():
    """Speedup ignores the sample the AR run lacks; AR's own speedup is 1."""
    matched = compare.match_ar(read.load_runs([RUNS]))
    fake = _row(matched, "fake_humaneval")
    assert Path(fake["ar_run_dir"]).name == "ar_humaneval"
    assert fake["n_common"] == 3
    # s0..s2 only: 12 tokens in 0.6 s against AR's 12 in 1.2 s (with s3 it would read 2.57).
    assert fake["speedup"] == pytest.approx(2.0)
    # Mean per-sample rates: (40 + 20 + 12) / 3 = 24 against AR's 10.
    assert fake["speedup_mean"] == pytest.approx(2.4)
    ar = _row(matched, "ar_humaneval")
    assert (ar["speedup"], ar["speedup_mean"], ar["exact_match_rate"]) == (1.0, 1.0, 1.0)


def test_run_without_ar_baseline_gets_nan():
    """A run with no matching AR run gets NaN speedup and exact-match rate."""
    orphan = _row(compare.match_ar(read.load_runs([RUNS])), "fake_mtbench")
    assert pd.isna(orphan["ar_run_dir"]) and orphan["n_common"] == 0
    assert math.isnan(orphan["speedup"]) and math.isnan(orphan["exact_match_rate"])


def test_other_hardware_is_not_a_baseline():
    """An AR run on another device is not a baseline."""
    runs, samples = read.load([RUNS])
    moved = runs.assign(device_name=runs["device_name"].where(runs["method"] == "ar", "H100"))
    assert math.isnan(_row(compare.match_ar(moved, samples), "fake_humaneval")["speedup"])


def with_sessions(samples: pd.DataFrame, fake: str, ar: str) -> pd.DataFrame:
    """The samples with fake_humaneval's records in session ``fake`` and ar_humaneval's in ``ar``."""
    names = samples["run_dir"].map(lambda path: Path(path).name)
    session = names.map({"fake_humaneval": fake, "ar_humaneval": ar})
    return samples.assign(measuring_session=session.where(session.notna(), None))


def test_same_session_pairing_refuses_an_ar_partner_timed_in_another_session_or_machine():
    """The reproduction's rule: a speedup divides times of one session. An AR partner of another session (or
    machine) gives no speedup nor overhead, with the reason; the same session pairs as before."""
    runs, samples = read.load([RUNS])
    one = with_sessions(samples, "20260101T000000Z-aaaaaa-1", "20260101T000000Z-aaaaaa-1")
    fake = _row(compare.match_ar(runs, one, same_session=True), "fake_humaneval")
    assert fake["speedup"] == pytest.approx(2.0) and fake["pairing"] == "" and fake["overhead"] == pytest.approx(0.9)
    for ar_session, where in (
        ("20260102T000000Z-aaaaaa-2", "in another session"),
        ("20260101T000000Z-bbbbbb-1", "on another machine"),
    ):
        apart = with_sessions(samples, "20260101T000000Z-aaaaaa-1", ar_session)
        refused = _row(compare.match_ar(runs, apart, same_session=True), "fake_humaneval")
        assert math.isnan(refused["speedup"]) and math.isnan(refused["overhead"]) and refused["n_common"] == 0
        assert refused["pairing"] == f"3 of 3 samples' AR partner timed {where}"
        assert _row(compare.match_ar(runs, apart), "fake_humaneval")["speedup"] == pytest.approx(2.0)  # the report's
    unrecorded = _row(compare.match_ar(runs, samples, same_session=True), "fake_humaneval")  # fixture: no sessions
    assert math.isnan(unrecorded["speedup"]) and "no measuring session recorded" in unrecorded["pairing"]
    ar = _row(compare.match_ar(runs, samples, same_session=True), "ar_humaneval")
    assert ar["speedup"] == 1.0 and ar["pairing"] == ""  # an AR run with itself: one record each
    assert (
        compare.paired_samples(runs, samples, same_session=True)["run_dir"]
        .map(lambda p: Path(p).name)
        .eq("ar_humaneval")
        .all()
    )


def test_a_resumed_session_keeps_the_pairs_timed_together():
    """Samples of one run timed in two sittings pair with the AR samples of their own sitting; the one whose AR
    partner was timed in the other sitting is left out of the speedup, and the reason counts it."""
    runs, samples = read.load([RUNS])
    names = samples["run_dir"].map(lambda path: Path(path).name)
    first, second = "20260101T000000Z-aaaaaa-1", "20260101T010000Z-aaaaaa-2"
    session = pd.Series(first, index=samples.index).where(samples["sample_id"] != "s2", second)
    session = session.where(~((names == "ar_humaneval") & (samples["sample_id"] == "s1")), second)
    matched = compare.match_ar(runs, samples.assign(measuring_session=session), same_session=True)
    fake = _row(matched, "fake_humaneval")
    assert fake["n_common"] == 2 and fake["pairing"] == "1 of 3 samples' AR partner timed in another session"
    assert fake["speedup"] == pytest.approx((4 + 3) / 0.35 / ((4 + 3) / 0.7))  # s0 and s2 only
    assert math.isnan(fake["overhead"])  # a run-level ratio: only when every pair was timed together


def test_a_run_kept_to_some_categories_pairs_with_the_ar_run_of_the_same_categories():
    """An AR run of the same categories (dataset.categories) is preferred over a larger AR run of every one."""
    runs, samples = read.load([RUNS])
    ar = runs[runs["run_dir"].str.endswith("ar_humaneval")]
    subset_ar = ar.assign(run_dir=ar["run_dir"] + "_subset", categories="writing,roleplay", n_records=1)
    subset_samples = samples[samples["run_dir"].isin(ar["run_dir"])].assign(run_dir=lambda f: f["run_dir"] + "_subset")
    fake = runs["run_dir"].str.endswith("fake_humaneval")
    kept = runs.assign(categories=runs["categories"].where(~fake, "writing,roleplay"))
    both = pd.concat([kept, subset_ar], ignore_index=True)
    matched = compare.match_ar(both, pd.concat([samples, subset_samples], ignore_index=True))
    assert _row(matched, "fake_humaneval")["ar_run_dir"].endswith("ar_humaneval_subset")
    assert _row(compare.match_ar(runs, samples), "fake_humaneval")["ar_run_dir"].endswith("ar_humaneval")


def test_rate_intervals_bracket_each_runs_totals_and_vanish_for_one_sample():
    """The bootstrap interval of throughput and tokens/step holds the run's own total/total value; a run of one
    identical record has a zero-width interval at it; a record without steps leaves tokens/step undefined."""
    runs, samples = read.load([RUNS])
    intervals = runs.merge(compare.rate_intervals(samples), left_on="run_dir", right_index=True)
    for metric in ("throughput_total", "tokens_per_step"):
        defined = intervals.dropna(subset=[metric])
        assert (defined[f"{metric}_ci_low"] <= defined[metric] + 1e-9).all()
        assert (defined[metric] <= defined[f"{metric}_ci_high"] + 1e-9).all()
    record = {"run_dir": "one", "new_tokens": 9, "wall_s": 3.0, "target_forwards": 4}
    single = compare.rate_intervals(pd.DataFrame([record, record]))
    assert single.loc["one", "throughput_total_ci_low"] == single.loc["one", "throughput_total_ci_high"] == 3.0
    assert single.loc["one", "tokens_per_step_ci_low"] == pytest.approx(2.0)
    stepless = compare.rate_intervals(pd.DataFrame([{**record, "new_tokens": 1, "target_forwards": 0}]))
    assert math.isnan(stepless.loc["one", "tokens_per_step_ci_low"])


def test_a_runs_bootstrap_interval_depends_on_its_own_samples_only():
    """Adding or leaving out another run does not move a run's interval (one generator per run, not one shared)."""
    runs, samples = read.load([RUNS])
    pairs = compare.paired_samples(runs, samples)
    kept = sorted(pairs["run_dir"].unique())[-1]
    alone = compare.speedup_statistics(pairs[pairs["run_dir"] == kept])
    assert alone.loc[kept].equals(compare.speedup_statistics(pairs).loc[kept])
    own = samples[samples["run_dir"] == kept]
    assert compare.rate_intervals(own).loc[kept].equals(compare.rate_intervals(samples).loc[kept])


def test_exact_match_rate_and_first_divergence():
    """s1 diverges from AR at token 2; s0 and s2 match; s3 is not compared."""
    runs, samples = read.load([RUNS])
    fake = _row(compare.match_ar(runs, samples), "fake_humaneval")
    assert fake["exact_match_rate"] == pytest.approx(2 / 3)
    compared = compare.divergences(runs, samples)
    assert sorted(compared["sample_id"]) == ["s0", "s1", "s2"]  # s3 has no AR partner
    by_sample = compared.set_index("sample_id")
    assert by_sample.loc["s1", "first_divergence"] == 2 and not by_sample.loc["s1", "exact_match"]
    assert list(by_sample.loc[["s0", "s2"], "first_divergence"]) == [-1, -1]
    assert by_sample.loc[["s0", "s2"], "exact_match"].all()


@pytest.mark.parametrize(
    "output, reference, expected",
    [
        ([1, 2, 3], [1, 2, 3], -1),
        ([1, 2, 3], [1, 5, 3], 1),
        ([1, 2], [1, 2, 3], 2),
        ([1, 2, 3, 4], [1, 2], 2),
        ([], [7], 0),
    ],
)
def test_first_divergence(output, reference, expected):
    """Equal, differing, prefix and empty outputs give the documented index."""
    assert compare.first_divergence(output, reference) == expected


def test_table_columns_and_format():
    """The table has the researcher columns; the text is rounded, in ms, '-' for NaN."""
    frame = view.table([RUNS])
    assert list(frame.columns) == view.TABLE_COLUMNS
    assert list(frame["method"]) == ["ar", "fake_method", "fake_method"]
    text = view.format_table(frame)
    fake_line = next(line for line in text.splitlines() if "fake_humaneval" in line)
    assert "25.71" in fake_line and "90.00" in fake_line and "0.67" in fake_line  # ms, rounded
    orphan_line = next(line for line in text.splitlines() if "fake_mtbench" in line)
    assert orphan_line.split()[-1] == "-"


def test_cli_prints_table_divergences_and_csv(tmp_path, capsys):
    """The CLI prints methods and the divergence of s1 and writes the CSV."""
    out = tmp_path / "report.csv"
    cli.main([str(RUNS), "--divergences", "--csv", str(out)])
    printed = capsys.readouterr().out
    assert "ar_humaneval" in printed and "fake_method" in printed
    divergence_line = next(line for line in printed.splitlines() if " s1 " in line)
    assert divergence_line.split()[-1] == "2"
    saved = pd.read_csv(out)
    assert len(saved) == 3 and saved["speedup"].iloc[1] == pytest.approx(2.0)


def test_cli_runs_as_a_module():
    """``python -m specbench.report`` runs and prints the table."""
    done = subprocess.run(
        [sys.executable, "-m", "specbench.report", str(RUNS / "ar_humaneval")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "ar_humaneval" in done.stdout and " ar " in done.stdout


def test_cli_exits_2_on_folder_without_runs(tmp_path, capsys):
    """A folder without runs is a usage error (exit 2) with a message."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "no runs found" in capsys.readouterr().err


def test_cli_exits_2_on_run_without_samples(tmp_path, capsys):
    """A run without samples.jsonl is a usage error (exit 2) with a message."""
    run_dir = _copy_run("ar_humaneval", tmp_path)
    (run_dir / "samples.jsonl").unlink()
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(run_dir)])
    assert exit_info.value.code == 2
    assert "no samples.jsonl" in capsys.readouterr().err


def test_truncated_last_line_is_skipped_with_warning(tmp_path):
    """An interrupted run's truncated last line is skipped with a warning."""
    run_dir = _copy_run("ar_humaneval", tmp_path)
    with (run_dir / "samples.jsonl").open("a") as samples:
        samples.write('{"schema": "specbench.samples/1", "run_id": "ar_hum')
    with pytest.warns(UserWarning, match="truncated last line"):
        runs = read.load_runs([run_dir])
    assert runs["n_records"].iloc[0] == 3
    assert runs["throughput_total"].iloc[0] == pytest.approx(10.0)


def test_malformed_line_before_the_end_is_an_error(tmp_path):
    """A broken line before the last one is corruption, so it raises."""
    run_dir = _copy_run("ar_humaneval", tmp_path)
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    (run_dir / "samples.jsonl").write_text("\n".join([lines[0][:40], *lines[1:]]) + "\n")
    with pytest.raises(read.ReportError, match="samples.jsonl:1"):
        read.load_runs([run_dir])


def _categorized_copies(tmp_path: Path) -> Path:
    """ar_humaneval and fake_humaneval with categories a (s0, s2) and b (s1, s3)."""
    import json

    for name in ("ar_humaneval", "fake_humaneval"):
        run_dir = _copy_run(name, tmp_path)
        path = run_dir / "samples.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for record in records:
            record["category"] = "a" if record["sample_id"] in ("s0", "s2") else "b"
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return tmp_path


def test_by_category_pairs_each_category_with_its_ar_part(tmp_path, capsys):
    """--by category: one row per run and category, each compared with the AR run's same category."""
    frame = view.table([_categorized_copies(tmp_path)], by="category")
    fake_a, fake_b = _row(frame, "fake_humaneval#a"), _row(frame, "fake_humaneval#b")
    assert (fake_a["dataset"], fake_a["n_samples"], fake_b["n_samples"]) == ("humaneval/a", 2, 2)
    assert (
        Path(
            compare.match_ar(*read.load([tmp_path], by="category"))
            .set_index("run_dir")
            .loc[fake_a["run_dir"], "ar_run_dir"]
        ).name
        == "ar_humaneval#a"
    )
    # a: s0 + s2 = 7 tokens in 0.35 s vs AR's 7 in 0.7 s; b: only s1 is common (5 in 0.25 vs 5 in 0.5)
    assert fake_a["speedup"] == pytest.approx(2.0) and fake_b["speedup"] == pytest.approx(2.0)
    assert (fake_a["exact_match_rate"], fake_b["exact_match_rate"]) == (1.0, 0.0)
    assert fake_a["tokens_per_step"] == pytest.approx((3 + 2) / 2)
    cli.main([str(tmp_path), "--by", "category"])
    assert "fake_humaneval#b" in capsys.readouterr().out


def test_run_summary_computes_what_records_give_and_names_what_is_missing():
    """The one summary builder: n_samples and metrics from the records, every schema field required."""
    from specbench.metrics import TRAFFIC_METRICS, aggregate, run_summary
    from specbench.schema import SUMMARY_FIELDS

    records = [{"sample_id": "a", "new_tokens": 2, "wall_s": 1.0, "prefill_s": 0.1, "target_forwards": 1}]
    given = {name: None for name in SUMMARY_FIELDS if name not in ("schema", "n_samples", "metrics")}
    summary = run_summary(records, **given, model_path="x")
    no_traffic = dict.fromkeys(TRAFFIC_METRICS)  # memory_traffic None: no bandwidth share
    assert summary["n_samples"] == 1 and summary["model_path"] == "x"
    assert summary["metrics"] == {**aggregate(records), **no_traffic}
    with pytest.raises(ValueError, match="target"):
        run_summary(records, **{name: value for name, value in given.items() if name != "target"})
    with pytest.raises(ValueError, match="computed from the records"):
        run_summary(records, **given, n_samples=3)


def test_acceptance_view_and_its_figure(tmp_path, capsys):
    """fake_humaneval's steps accept 2, 1, 1, 1, 4 drafted tokens (records without depth: every drafting step
    reaches every depth); AR drafts nothing and has no rows."""
    figure = tmp_path / "acceptance.png"
    cli.main([str(RUNS / "ar_humaneval"), str(RUNS / "fake_humaneval"), "--view", "acceptance", "--plot", str(figure)])
    frame = view.table([RUNS / "ar_humaneval", RUNS / "fake_humaneval"], view="acceptance")
    assert set(frame["run"]) == {"fake_humaneval"} and list(frame["depth"]) == [0, 1, 2, 3, 4]
    depth = frame.set_index("depth")
    assert depth.loc[1, "joint"] == 1.0 and depth.loc[1, "exactly"] == pytest.approx(3 / 5)
    assert depth.loc[2, "joint"] == pytest.approx(2 / 5) and depth.loc[2, "conditional"] == pytest.approx(2 / 5)
    assert depth.loc[4, "conditional"] == 1.0  # the one step past depth 2 went on to 4
    assert figure.stat().st_size > 0 and "wrote" in capsys.readouterr().out


def test_latency_view_reads_percentiles_in_ms(capsys):
    cli.main([str(RUNS / "ar_humaneval"), "--view", "latency"])
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert header.split()[:4] == ["run", "method", "n", "tok/s"] and "step_p99_ms" in header
    assert row.split()[-4:-1] == ["100.00", "100.00", "100.00"]  # every AR step takes 0.1 s


def test_length_view_and_figure(tmp_path, capsys):
    """Each run at its mean prompt length with its speedup and step split; --plot draws them against the length."""
    figure = tmp_path / "length.png"
    cli.main([str(RUNS / "ar_humaneval"), str(RUNS / "fake_humaneval"), "--view", "length", "--plot", str(figure)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run", "method", "prompt_tok"] and "verify" in lines[0]
    assert figure.stat().st_size > 0


def test_plot_needs_the_acceptance_view(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main([str(RUNS), "--plot", "x.png"])
    assert stopped.value.code == 2 and "--view acceptance" in capsys.readouterr().err


def test_a_repeated_line_counts_once_and_a_conflicting_one_is_refused(tmp_path):
    run = _copy_run("fake_humaneval", tmp_path)
    samples = run / "samples.jsonl"
    lines = samples.read_text().splitlines()
    samples.write_text("\n".join([*lines, lines[0]]) + "\n")
    with pytest.warns(UserWarning, match=r"lines \[5\] repeat earlier records"):
        frame = read.load_runs([run])
    assert frame.loc[0, "new_tokens"] == 18  # 4 + 5 + 3 + 6, s0 once
    changed = json.loads(lines[0]) | {"wall_s": 9.0}
    samples.write_text("\n".join([*lines, json.dumps(changed)]) + "\n")
    with pytest.raises(read.ReportError, match=r"samples.jsonl:5: sample 's0' turn 0 was already recorded"):
        read.load_runs([run])


@pytest.mark.parametrize(
    ("field", "value"), [("wall_s", "fast"), ("new_tokens", 2.5), ("accept_lengths", [1, "2"]), ("turn", -1)]
)
def test_a_wrongly_typed_field_is_one_error_naming_file_line_and_field(tmp_path, field, value, capsys):
    run = _copy_run("fake_humaneval", tmp_path)
    samples = run / "samples.jsonl"
    lines = samples.read_text().splitlines()
    lines[1] = json.dumps(json.loads(lines[1]) | {field: value})
    samples.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit) as stopped:
        cli.main([str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1
    assert "samples.jsonl:2" in err[0] and field in err[0]


def test_a_torn_summary_or_undecodable_records_are_one_error(tmp_path, capsys):
    run = _copy_run("fake_humaneval", tmp_path)
    (run / "summary.json").write_text('{"model": "tiny", "meth')
    with pytest.raises(SystemExit):
        cli.main([str(run)])
    assert "summary.json is not valid JSON" in capsys.readouterr().err
    run = _copy_run("ar_humaneval", tmp_path)
    (run / "samples.jsonl").write_bytes(b'{"schema": "\xff\xfe"}\n')
    with pytest.raises(SystemExit):
        cli.main([str(run)])
    assert "not UTF-8 text at byte" in capsys.readouterr().err


@pytest.mark.parametrize("kept", [0, 2], ids=["emptied", "cut"])
def test_the_sample_count_is_the_records_and_a_disagreeing_summary_is_warned_about(tmp_path, kept):
    """An emptied samples.jsonl reports n 0, one cut to 2 of its 3 lines n 2: the records are counted, not
    summary.json's n_samples, and the disagreement is a warning naming both counts."""
    run_dir = _copy_run("ar_humaneval", tmp_path)
    samples = run_dir / "samples.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:kept]))
    with pytest.warns(UserWarning, match=f"summary.json counts 3 samples but samples.jsonl holds {kept}"):
        runs = read.load_runs([run_dir])
    assert runs["n_samples"].tolist() == [kept]
    with pytest.warns(UserWarning, match="summary.json counts 3 samples"):
        header, row = view.format_table(view.report_table(*read.load([run_dir]))).splitlines()
    assert row.split()[header.split().index("n")] == str(kept)


def test_runs_of_the_eager_path_pair_alike_against_same_or_eager_ar_and_none_against_compiled(capsys):
    """The fixtures were all eager (no compile record): --ar eager pairs them as the default does; --ar compiled
    finds no compiled AR run, so no speedup."""
    same, eager = view.table([RUNS]), view.table([RUNS], against="eager")
    pd.testing.assert_frame_equal(same, eager)
    assert view.table([RUNS], against="compiled")["speedup"].isna().all()
    cli.main([str(RUNS), "--ar", "eager"])
    assert "fake_method" in capsys.readouterr().out
