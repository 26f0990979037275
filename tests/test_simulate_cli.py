import json
import subprocess
import sys

import pytest

from simulations.cli import main

POLICIES = [
    "--policy",
    "static:max_batch=4,timeout=2ms",
    "--policy",
    "static:max_batch=16,timeout=5ms",
]


@pytest.fixture
def small_trace(tmp_path):
    path = tmp_path / "small.csv"
    path.write_text("timestamp,count\n" + "".join(f"{s},{200 + 50 * (s % 7)}\n" for s in range(60)))
    return path


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_json_summary_schema_and_side_by_side_policies(capsys, small_trace):
    summary = run_json(capsys, "--trace", str(small_trace), "--workers", "2", *POLICIES)
    assert summary["trace"] == "small.csv"
    assert summary["workers"] == 2 and summary["slo_ms"] == 100
    assert [p["policy"] for p in summary["policies"]] == [
        "static:max_batch=4,timeout=2ms",
        "static:max_batch=16,timeout=5ms",
    ]
    for policy in summary["policies"]:
        assert policy["completed"] + policy["shed"] == summary["requests"]
        assert set(policy["latency_ms"]) == {"p50", "p90", "p99", "p999", "max", "mean"}
        assert (
            policy["latency_ms"]["p50"]
            <= policy["latency_ms"]["p99"]
            <= policy["latency_ms"]["max"]
        )
        for key in (
            "throughput_rps",
            "slo_attainment",
            "mean_batch_size",
            "batch_fill_ratio",
            "utilization",
            "busy_seconds",
            "wall_s",
            "sim_requests_per_s",
        ):
            assert isinstance(policy[key], int | float), key
    small, large = summary["policies"]
    assert large["mean_batch_size"] > small["mean_batch_size"]


def test_same_seed_same_answer(capsys, small_trace):
    first = run_json(capsys, "--trace", str(small_trace), "--seed", "5")
    second = run_json(capsys, "--trace", str(small_trace), "--seed", "5")

    def strip(s):
        return [
            {k: v for k, v in p.items() if k not in ("wall_s", "sim_requests_per_s")}
            for p in s["policies"]
        ]

    assert strip(first) == strip(second)


def test_out_dir_gets_summary_timelines_and_plots(capsys, small_trace, tmp_path):
    out = tmp_path / "out"
    assert main(["--trace", str(small_trace), "--out", str(out), *POLICIES]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "arrival_rate.png",
        "batching.png",
        "control.png",
        "decisions-static-max_batch-16-timeout-5ms.jsonl",
        "decisions-static-max_batch-4-timeout-2ms.jsonl",
        "p99.png",
        "report.html",
        "summary.json",
        "timeline-static-max_batch-16-timeout-5ms.csv",
        "timeline-static-max_batch-4-timeout-2ms.csv",
    ]
    timeline = (out / "timeline-static-max_batch-4-timeout-2ms.csv").read_text().splitlines()
    assert timeline[0].startswith("start_s,end_s,arrivals,completed,shed,p50_ms,p99_ms")
    assert len(timeline) == 1 + 6  # 60 s in 10 s windows
    assert "wrote" in capsys.readouterr().out
    page = (out / "report.html").read_text()
    # Self-contained: the four plots inline, nothing fetched from anywhere.
    assert page.count('src="data:image/png;base64,') == 4
    assert "http://" not in page and "https://" not in page
    assert "static:max_batch=4,timeout=2ms" in page and "SLO %" in page
    # Every column defined under the table; the plots at their native width, in boxes
    # that scroll sideways rather than shrink them.
    for column in ("p50 ms", "p99.9 ms", "worst 10 min %", "fill", "util", "busy s / 1k"):
        assert f"<dt>{column}</dt>" in page
    assert page.count('<div class="plot">') == 4 and "max-width: none" in page


def test_plots_read_at_a_glance():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulations.plots import POLICY_COLORS, SLO_COLOR, _cap_axis, _latency_axis

    fig, (caps, latency) = plt.subplots(1, 2)
    caps.plot([0, 1], [32, 128])
    _cap_axis(caps, [32, 128])
    fig.canvas.draw()
    labels = [t.get_text() for t in caps.get_yticklabels() if t.get_visible()]
    assert {"32", "64", "128"} <= set(labels)  # numbers, not 3x10^1
    assert caps.get_ylim()[1] > 128  # the top cap is not clipped
    latency.plot([0, 1], [20, 400])
    _latency_axis(latency, [20, 400], 100.0)
    fig.canvas.draw()
    shown = {t.get_text() for t in latency.get_yticklabels()}
    assert {"50", "100", "200"} <= shown
    assert SLO_COLOR not in POLICY_COLORS
    plt.close(fig)


def test_the_slo_sits_inside_a_latency_axis_between_labels():
    """p99 between 45 and 80 ms against a 100 ms SLO once read 50 and 100 only, with the
    SLO on the frame's top edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulations.plots import _latency_axis

    fig, ax = plt.subplots()
    ax.plot([0, 1], [45, 80])
    _latency_axis(ax, [45, 80], 100.0)
    fig.canvas.draw()
    low, high = ax.get_ylim()
    assert low < 20 and high > 200  # a fifth of the SLO to twice it, at least
    shown = {t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high}
    assert {"20", "50", "100", "200"} <= shown
    plt.close(fig)


def test_the_control_plot_marks_events_and_the_slo_by_value(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from forecaster.events import Event
    from simulations import plots
    from simulations.timeline import WindowRow

    rows = tuple(
        WindowRow(10.0 * i, 10.0 * (i + 1), 100, 100, 0, 5.0, 9.0, 4.0, 0.5, 0.3, 0, 16, 5.0,
                  warm_max_batch=64 if i == 3 else 16)
        for i in range(6)
    )  # fmt: skip
    result = type("Result", (), {"timeline": rows, "policy": "predictive"})()
    report = type(
        "Report",
        (),
        {"results": (result,), "scaling": False, "slo_s": 0.1, "clock_origin_s": 1.8e9,
         "window_s": 10.0,
         "origin_s": 1.8e9, "events": (Event("sale", 1.8e9 + 20, 1.8e9 + 40, 3.0),)},
    )()  # fmt: skip
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    plots._plot_control(report, tmp_path / "control.png")
    figure = drawn[0]
    # A header row holds each column's legend above the panels; then the row's panels.
    (load_legend, config_legend, p99_legend), (load, config, p99) = (
        [ax.get_legend() for ax in figure.axes[:3]],
        figure.axes[3:6],
    )
    assert "declared events" in load.get_legend_handles_labels()[1]
    assert "SLO 100 ms" in p99.get_legend_handles_labels()[1]
    assert "SLO 100 ms" in [t.get_text() for t in p99_legend.get_texts()]
    legend = [t.get_text() for t in config_legend.get_texts()]
    assert legend == [
        "cap asked",
        "cap served",
        "kept warm above",
        "timeout (ms)",
        "declared events",
    ]
    assert load_legend.get_title().get_text() == "load (req/s)"
    assert config.get_ylabel() == "max batch"
    low, high = p99.get_ylim()
    assert low < 100 / 1.5 and high > 100 * 1.5  # the SLO inside the frame
    # The trace's clock (not hours since start), dated once, under the figure.
    assert figure.get_supxlabel() == "time (UTC) from 2027-01-15 08:00"
    assert load.get_xlabel() == ""
    plt.close(figure)


def test_the_control_plot_puts_every_row_on_one_scale_per_column(tmp_path, monkeypatch):
    """Rows whose timeouts, caps and p99 differ still read on the same axes, twins too."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from simulations import plots
    from simulations.timeline import WindowRow

    def result(policy, p99_ms, cap, timeout_ms):
        rows = tuple(
            WindowRow(10.0 * i, 10.0 * (i + 1), 100, 100, 0, 5.0, p99_ms, 4.0, 0.5, 0.3, 0,
                      cap, timeout_ms, served_max_batch=cap)
            for i in range(6)
        )  # fmt: skip
        return type("Result", (), {"timeline": rows, "policy": policy})()

    results = (result("static", 60.0, 8, 2.0), result("aimd", 900.0, 128, 40.0))
    report = type(
        "Report",
        (),
        {"results": results, "scaling": False, "slo_s": 0.1, "clock_origin_s": None,
         "origin_s": 0.0, "events": (), "window_s": 10.0},
    )()  # fmt: skip
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    plots._plot_control(report, tmp_path / "control.png")
    figure = drawn[0]
    rows = [figure.axes[3:6], figure.axes[6:9]]
    timeouts = [ax for ax in figure.axes[9:] if ax.get_ylabel() == "timeout (ms)"]
    for column in range(3):
        assert rows[0][column].get_ylim() == rows[1][column].get_ylim()
    assert len(timeouts) == 2 and timeouts[0].get_ylim() == timeouts[1].get_ylim()
    assert timeouts[0].get_ylim()[1] >= 40.0
    assert figure.get_supxlabel() == "hours since the start"
    plt.close(figure)


def test_memory_limit_clamps_and_says_so(capsys, small_trace):
    model = "linear:5,0.4,device_memory=1GiB,parameter_memory=512MiB,sample_memory=64MiB"
    summary = run_json(
        capsys,
        "--trace",
        str(small_trace),
        "--latency-model",
        model,
        "--policy",
        "static:max_batch=32,timeout=5ms",
    )
    assert summary["policies"][0]["clamped_max_batch"] == {"requested": 32, "applied": 8}
    assert any("exceeds the memory limit; ran with 8" in n for n in summary["notes"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "missing.csv"], "missing.csv: no such trace file"),
        (["--policy", "static:max_batch=0"], "max_batch_size must be >= 1, got 0"),
        (["--policy", "bogus"], "unknown policy 'bogus'"),
        (["--policy", "static:size=3"], "unknown option 'size'"),
        (["--latency-model", "linear:5"], "expected linear:BASE_MS,PER_ITEM_MS"),
        (["--guard", "dwell=soon"], "dwell"),
        (["--guard", "speed=3"], "--guard: unknown key 'speed'"),
        (["--guard", "min_batch=64,max_batch=8"], "min_batch <= max_batch"),
        (["--events", "nowhere.yaml"], "nowhere.yaml: no such events file"),
        (["--policy", "predictive:lead=soon"], "lead"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(capsys, small_trace, argv, message):
    argv = argv if "--trace" in argv else ["--trace", str(small_trace), *argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0 and err.startswith("simulate: error:")


def test_bad_flag_value_exits_2_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "simulations.cli", "--slo", "fast"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "argument --slo" in result.stderr and "Traceback" not in result.stderr


def test_malformed_trace_through_the_command_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,count\n0,1\n1,x\n")
    result = subprocess.run(
        [sys.executable, "-m", "simulations.cli", "--trace", str(bad)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        f"simulate: error: {bad}:3: cannot parse 'count' as a number in row '1,x'"
    )


def test_adaptive_policies_side_by_side_with_decisions(capsys, tmp_path):
    path = tmp_path / "step.csv"
    rows = [f"{s},{300 if s < 120 else 3000}\n" for s in range(240)]
    path.write_text("timestamp,count\n" + "".join(rows))
    events = tmp_path / "events.yaml"
    events.write_text("events:\n- {name: step, start: 120, end: 240, multiplier: 10}\n")
    out = tmp_path / "out"
    argv = ["--trace", str(path), "--events", str(events), "--warmup", "10s", "--workers", "4"]
    for spec in ("static:max_batch=16,timeout=5ms", "aimd", "reactive", "predictive", "oracle"):
        argv += ["--policy", spec]
    summary = run_json(capsys, *argv, "--out", str(out), "--shadow", "reactive")
    names = [p["policy"].split(":")[0] for p in summary["policies"]]
    assert names == ["static", "aimd", "reactive", "predictive", "oracle"]
    for policy in summary["policies"]:
        assert 0 <= policy["slo_attainment_worst_10min"] <= policy["slo_attainment"] <= 1
        assert policy["busy_seconds_per_1k"] > 0
        assert policy["fallback_s"] >= 0 and policy["config_changes"] >= 0
    predictive = summary["policies"][3]
    assert predictive["config_changes"] > 0
    lines = (out / "decisions-predictive.jsonl").read_text().splitlines()
    record = json.loads(lines[-1])
    assert {"at_s", "previous", "chosen", "reason", "inputs", "forecast", "alternatives"} <= set(
        record
    )
    assert record["shadow"]["policy"].startswith("reactive")
    assert (out / "control.png").stat().st_size > 0


@pytest.mark.parametrize("interval_s", [60, 300])
def test_exported_count_traces_replay_with_every_policy(capsys, tmp_path, interval_s):
    """CloudWatch and Prometheus export counts per minute or five: each interval's count
    is spread over it, so every policy replays them at a 1 s tick."""
    trace = tmp_path / "export.csv"
    rows = "".join(f"{i * interval_s},{interval_s * (40 + 20 * (i % 3))}\n" for i in range(8))
    trace.write_text("timestamp,count\n" + rows)
    policies = ["static:max_batch=8,timeout=2ms", "aimd", "reactive", "predictive", "oracle"]
    argv = ["--trace", str(trace), "--workers", "1"]
    summary = run_json(capsys, *argv, *[a for p in policies for a in ("--policy", p)])
    total = sum(interval_s * (40 + 20 * (i % 3)) for i in range(8))
    assert summary["requests"] == pytest.approx(total, rel=0.02)  # Poisson around the counts
    assert len(summary["policies"]) == len(policies)
    assert all(p["completed"] + p["shed"] == summary["requests"] for p in summary["policies"])


@pytest.mark.parametrize(
    "text",
    [
        "timestamp,count\n0,5\n1,6,7\n2,8\n",  # a ragged row
        "timestamp\n2024-01-01 00:00:00,3\n2024-01-01 00:00:01\n",  # ragged, first column
        "foo,bar\n1,2\n3,4\n",  # no timestamp column
        "timestamp\n2024-01-01 00:00:00\n",  # a single request
    ],
)
def test_bad_traces_are_one_line_and_exit_2_in_simulate_and_backtest(tmp_path, capsys, text):
    from server.cli import main as tidal

    trace = tmp_path / "bad.csv"
    trace.write_text(text)
    assert main(["--trace", str(trace)]) == 2
    backtest = ["forecast", "backtest", "--trace", str(trace), "--step", "1m", "--horizon", "5m"]
    assert tidal(backtest) == 2
    simulate_err, backtest_err = capsys.readouterr().err.strip().split("\n")
    assert simulate_err.startswith(f"simulate: error: {trace}")
    assert backtest_err.startswith(f"tidal: error: {trace}")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate-scale", "1e9"], "would hold 1.73e+17 requests"),
        (["--time-scale", "1e9"], "the replay lasts 8.64e-05 s"),
        (["--time-scale", "20000"], "arrivals in a minute of replay"),
        (["--workers", "100000"], "--workers 100000: at most 10,000 simulated workers"),
        (["--out", "/proc/cannot-write-here"], "--out /proc/cannot-write-here: cannot write"),
    ],
)
def test_implausible_flags_are_refused_before_any_work(capsys, argv, message):
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simulate: error: ") and message in err and err.count("\n") == 1


def test_forcing_requests_on_a_count_trace_says_so(tmp_path, capsys, small_trace):
    assert main(["--trace", str(small_trace), "--format", "requests"]) == 2
    assert "this is a count-level trace" in capsys.readouterr().err


def test_bare_numbers_are_seconds_said_in_help_and_warned_when_implausible(capsys, small_trace):
    from server.cli import build_parser as tidal_parser
    from simulations.cli import build_parser as simulate_parser

    words = " ".join(simulate_parser().format_help().split())  # help wraps its lines
    assert words.count("a bare number is seconds") >= 5
    command = next(a for a in tidal_parser("controller")._actions if a.dest == "command")
    assert "--slo SLO             p99 SLO (default 100ms) (a bare number is seconds)" in (
        command.choices["controller"].format_help()
    )
    argv = ["--trace", str(small_trace), "--slo", "100", "--json"]
    assert main([*argv, "--policy", "static:max_batch=8,timeout=20s"]) == 0
    err = capsys.readouterr().err
    assert (
        "--slo 100 is 100 seconds (a bare number is seconds); for milliseconds write 100ms" in err
    )
    assert "a batch timeout of 20 s (a bare number is seconds)" in err


@pytest.mark.parametrize("timeout", ["10", "20", "0.5"])
def test_a_bare_number_in_a_spec_is_warned_about_once(capsys, small_trace, timeout):
    spec = f"static:max_batch=8,timeout={timeout}"
    argv = ["--trace", str(small_trace), "--policy", spec, "--guard", "dwell=60", "--json"]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"simulate: warning: timeout={timeout} in {spec} has no unit, read as {timeout} s; "
        f"write {timeout}ms or {timeout}s",
        "simulate: warning: dwell=60 in --guard dwell=60 has no unit, read as 60 s; "
        "write 60ms or 60s",
    ]


def test_units_and_zero_are_not_warned_about(capsys, small_trace):
    argv = ["--trace", str(small_trace), "--policy", "static:max_batch=8,timeout=0", "--json"]
    assert main([*argv, "--policy", "aimd:timeout=5ms", "--guard", "dwell=1m"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--policy", "static:max_batch=99999999999,timeout=10ms"],
            "policy 'static:max_batch=99999999999,timeout=10ms': max_batch must be <= 65,536, "
            "got 99999999999",
        ),
        (
            ["--shadow", "static:timeout=2h"],
            "policy 'static:timeout=2h': timeout must be <= 60s, got 2h",
        ),
        (["--guard", "max_batch=99999999999"], "--guard: max_batch must be <= 65,536"),
        (["--guard", "max_timeout=1h"], "--guard: max_timeout must be <= 60s, got 1h"),
    ],
)
def test_implausible_spec_values_are_refused_in_one_line(capsys, small_trace, argv, message):
    assert main(["--trace", str(small_trace), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"simulate: error: {message}") and err.count("\n") == 1


def test_help_lists_the_policy_kinds_and_their_options():
    from adaptive.policy_kinds import POLICY_KINDS
    from simulations.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    for kind in POLICY_KINDS.values():
        assert f" {kind.name} {kind.summary} " in text
        assert " ".join(option.usage() for option in kind.options) in text


def test_an_events_file_with_a_misspelt_key_is_refused(capsys, small_trace, tmp_path):
    events = tmp_path / "events.yaml"
    events.write_text("events:\n- {name: s, start: 10, end: 50, multiplier: 3, ramp_upp: 5s}\n")
    assert main(["--trace", str(small_trace), "--events", str(events), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"simulate: error: {events}: event 1: unknown key 'ramp_upp' (known: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slo", "-5ms"], "argument --slo: duration must be a finite value >= 0, got '-5ms'"),
        (
            ["--rate-scale", "-1e3"],
            "argument --rate-scale: must be a finite number > 0, got '-1e3'",
        ),
        (["--slo", "--workers", "3"], "argument --slo: expected one argument"),
        (["--workers", "many"], "argument --workers: expected an integer, got 'many'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_command_line_mistake_is_one_line_and_where_to_look(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"simulate: error: {message}\nsee 'simulate --help'\n"
