"""The CLI's error contract: every command either exits 0 with the right output, or exits 2 with one `error:` line
and its `  hint:` on stderr, no traceback (`--debug` adds one). An internal error (exit 1), an exception escaping
`engine.cli.main`, a traceback without --debug, or a run past its deadline fails.

The hypothesis family drives each command in-process with generated flags: real flags with values of the wrong
type, negative, zero, huge, paths to folders, missing files and garbage files, and unknown flags. Commands that do
real work get tiny sizes, so a run that is accepted stays fast.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from contract import DEADLINE_S, deadline, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine import backends
from engine.cli import build_parser, main


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """No GPU, whatever this machine has: bench and the GPU backends refuse instead of measuring for minutes."""
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no CUDA device (test)"))


def run_cli(argv: list[str], cwd: Path | None = None, env: dict | None = None) -> tuple[int, str, str]:
    """engine.cli.main(argv) in-process under the contract's deadline: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    saved = {k: os.environ.get(k) for k in (env or {})}
    try:
        if cwd is not None:
            os.chdir(cwd)
        os.environ.update(env or {})
        with deadline(DEADLINE_S, f"python -m engine {' '.join(argv)}"), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:          # main returns argparse's status; a SystemExit is tolerated
                code = stop.code if isinstance(stop.code, int) else 2
    finally:
        os.chdir(before)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, out.getvalue(), err.getvalue()


def check_contract(argv: list[str], code: int, out: str, err: str) -> None:
    """Exit 0, or exit 2 whose stderr ends in one `error:` line and its hint lines; never a traceback."""
    shown = f"python -m engine {' '.join(argv)}\n--- exit {code}; stderr:\n{err[-2000:]}"
    assert "Traceback" not in err, shown
    assert code in (0, 2), shown
    if code == 2:
        lines = err.rstrip("\n").splitlines()
        errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
        assert len(errors) == 1, shown
        after = lines[errors[0] + 1:]
        assert after and all(line.startswith("  hint: ") for line in after), shown     # a hint, and nothing else
        assert len(lines[errors[0]]) > len("error: "), shown


# ---- the files the generated flags point at ---------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli_contract")
    (root / "folder").mkdir()
    (root / "garbage.npy").write_text("garbage\n")
    (root / "garbage_out.npy").write_text("garbage\n")     # an existing file an output may overwrite (not an input)
    (root / "garbage.json").write_text("{not json")
    (root / "binary.json").write_bytes(b"\xff\xfe\x00\x81 binary")
    (root / "list.json").write_text("[1, 2]")
    (root / "object.json").write_text('{"a": 1}')
    np.savez(root / "archive.npz", x=np.zeros((2, 2, 3)))
    np.save(root / "x.npy", np.random.default_rng(0).standard_normal((3, 2, 3)))
    np.save(root / "x2d.npy", np.zeros((3, 2)))
    engine.save(engine.preset("gru").cell, root / "gru.json")
    return {"root": root, "folder": root / "folder", "missing": root / "missing.json",
            "missing_npy": root / "missing.npy", "garbage": root / "garbage.npy", "garbage_json": root / "garbage.json",
            "binary_json": root / "binary.json", "list_json": root / "list.json", "object_json": root / "object.json",
            "npz": root / "archive.npz", "x": root / "x.npy", "x2d": root / "x2d.npy", "cell": root / "gru.json",
            "inside_file": root / "garbage.npy" / "out.npz", "new_folder": root / "new" / "sub" / "out.npz",
            "garbage_out": root / "garbage_out.npy"}


INPUT_PATHS = ["folder", "missing", "missing_npy", "garbage", "garbage_json", "binary_json", "list_json",
               "object_json", "npz", "x", "x2d", "cell"]
# "garbage_out", not "garbage": a run that overwrites it would turn an input the other tests read into an archive
OUTPUT_PATHS = ["folder", "inside_file", "new_folder", "garbage_out", "fresh"]


def value_strategy(kind: str, files: dict[str, Path]):
    """Values of one flag: a few valid ones (tiny), and every kind of wrong one."""
    ints = st.one_of(st.integers(1, 4), st.integers(-10**13, 0), st.integers(10**8, 10**13)).map(str)
    floats = st.one_of(st.floats(-1e3, 1e3, allow_nan=False).map(repr), st.sampled_from(["nan", "inf", "-inf", "1e400"]))
    words = st.one_of(st.sampled_from(["", "x", "1.5", "0x10", "-", "--", "1,2", "many", "lstm", "∞"]),
                      st.text(max_size=8))
    inputs = st.sampled_from(INPUT_PATHS).map(lambda name: str(files[name]))
    outputs = st.one_of(st.sampled_from(OUTPUT_PATHS[:-1]).map(lambda name: str(files[name])),
                        st.integers(0, 10**6).map(lambda n: str(files["root"] / f"out{n}.npz")))
    return {"int": st.one_of(ints, words), "float": st.one_of(floats, words), "in": st.one_of(inputs, words),
            "out": st.one_of(outputs, words), "word": words}[kind]


# command -> (the argv of a tiny valid run, its positional values to draw from, {flag: kind of value})
COMMANDS = {
    "run": (["-I", "3", "-H", "4", "-T", "3", "-B", "2", "-o", "{root}/run.npz"], ["lstm", "gru", "in"],
            {"-I": "int", "-H": "int", "-L": "int", "-P": "int", "-T": "int", "-B": "int", "--seed": "int",
             "--input": "in", "--params": "in", "-o": "out", "--backend": "word", "--dtype": "word",
             "--precision": "word"}),
    "show": (["-I", "3", "-H", "4"], ["lstm", "in"], {"-I": "int", "-H": "int", "-L": "int", "-P": "int"}),
    "explain": (["-I", "3", "-H", "4", "-T", "3", "-B", "2", "--no-source"], ["gru", "in"],
                {"-I": "int", "-H": "int", "-L": "int", "-T": "int", "-B": "int", "--chunk-steps": "int",
                 "--schedule": "word", "--layout": "word", "--off": "word"}),
    "export": (["-I", "3", "-H", "4", "-o", "{root}/export", "--force"], ["gru", "in"],
               {"-I": "int", "-H": "int", "-L": "int", "-o": "out", "--example": "int", "--seed": "int",
                "--chunk-steps": "int"}),
    "train": (["--steps", "2", "-H", "3", "-T", "3", "-B", "2"], ["lstm", "in"],
              {"--steps": "int", "-H": "int", "-L": "int", "-B": "int", "-T": "int", "--lr": "float",
               "--clip": "float", "--seed": "int", "--eval-every": "int", "--json": "out", "--task": "word",
               "--device": "word"}),
    "net": (["-I", "3", "-H", "3", "-T", "4", "-B", "2", "-o", "{root}/net.npz"], ["stack", "deepspeech", "in"],
            {"-I": "int", "-H": "int", "-T": "int", "-B": "int", "--seed": "int", "-o": "out", "--gpus": "int",
             "--split": "word", "--chunk": "int", "--run": None, "--json": None}),
    "bench": ([], [], {"--config": "in", "--preset": "in", "--reps": "int", "--warmup": "int", "--buffers": "int",
                       "--compile-budget": "float", "--time-budget": "float", "--seed": "int", "--out": "out",
                       "--copy-to": "out", "--impl": "word"}),
    "presets": ([], [], {"--json": None}),
}


@st.composite
def argv_of(draw, command: str, files: dict[str, Path]) -> list[str]:
    base, positionals, flags = COMMANDS[command]
    argv = [command]
    if positionals:
        choice = draw(st.sampled_from(positionals))
        argv.append(draw(value_strategy("in", files)) if choice == "in" else choice)
    argv += [arg.format(root=files["root"]) for arg in base]
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=3)):
        kind = flags[flag]
        argv.append(flag)
        if kind is not None:
            argv.append(draw(value_strategy(kind, files)))
            if flag == "--example":
                argv.append(draw(value_strategy(kind, files)))
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(1, len(argv))), draw(st.sampled_from(["--frobnicate", "-Z", "--seed=", "-"])))
    return argv


def check_result(argv: list[str], out: str, cwd: Path) -> None:
    """Where `run` was accepted on the reference, its saved outputs are the reference's for the parsed flags."""
    if argv[0] != "run":
        return
    args = build_parser().parse_args(argv)
    if args.backend != "reference" or args.params or args.precision != "float32" or args.dtype != "float64":
        return
    saved = np.load(cwd / out.strip().splitlines()[-1].rsplit(" to ", 1)[1])
    cell = engine.preset(args.cell).cell if args.cell in engine.presets() else engine.load(args.cell)
    x = (np.load(args.input) if args.input else
         np.random.default_rng(args.seed + 1).standard_normal((args.steps, args.batch, args.input_size)))
    net = engine.Network(cell, x.shape[2], args.hidden_size, args.layers, args.proj_size)
    want = engine.run(net, engine.init_params(net, seed=args.seed), x, backend="reference", dtype=np.float64)
    np.testing.assert_allclose(saved["outputs"], want.outputs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_keeps_the_contract_on_generated_flags(command, files):
    @settings(max_examples=examples(6 if command in ("train", "net", "explain") else 10, share=len(COMMANDS)),
              deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(argv=argv_of(command, files))
    def check(argv):
        code, out, err = run_cli(argv, cwd=files["root"])
        check_contract(argv, code, out, err)
        if code == 0:
            check_result(argv, out, files["root"])
    check()


# ---- the contract, one defect at a time ----------------------------------------------------------------

def test_an_engine_error_is_one_line_and_a_hint_with_exit_2():
    code, out, err = run_cli(["show", "no_such_cell"])
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and "no_such_cell" in lines[0]
    assert lines[1].startswith("  hint: ")


def test_a_usage_error_is_one_line_and_a_hint_with_exit_2():
    code, _, err = run_cli(["run", "lstm", "--frobnicate"])
    assert code == 2
    assert err.splitlines() == ["error: unrecognized arguments: --frobnicate",
                                "  hint: `python -m engine run --help` lists the options"]


@pytest.mark.parametrize("flag", ["-I", "-H", "-L", "-P", "-T", "-B"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_sizes_below_one_are_refused_at_the_flag(flag, value):
    code, _, err = run_cli(["run", "lstm", flag, value, "-o", "unused.npz"])
    assert code == 2 and f"{flag}: must be at least 1, got {value}" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, figure", [(["-H", "1048576"], "--hidden-size/-H: 1048576 is too large"),
                                          (["-T", str(10**12)], f"--steps/-T: {10**12} is too large"),
                                          (["-B", str(10**12)], f"--batch/-B: {10**12} is too large"),
                                          (["--seed", "-1"], "--seed: must be at least 0, got -1")])
def test_absurd_sizes_and_negative_seeds_are_refused_before_allocating(argv, figure, tmp_path):
    started = time.perf_counter()
    code, _, err = run_cli(["run", "lstm", *argv, "-o", str(tmp_path / "o.npz")])
    assert code == 2 and figure in err
    assert time.perf_counter() - started < 1.0 and list(tmp_path.iterdir()) == []


def test_an_input_the_machine_cannot_hold_is_refused_with_its_size(tmp_path):
    code, _, err = run_cli(["run", "lstm", "-T", "1000000", "-B", "65536", "-I", "16384", "-o", str(tmp_path / "o")])
    assert code == 2 and "the random input x of shape (1000000, 65536, 16384) would take" in err and "GiB" in err


@pytest.mark.parametrize("name, phrase", [("npz", "is an .npz archive, not one array"),
                                          ("folder", "is a folder, not a file"),
                                          ("garbage", "is not a .npy array"),
                                          ("missing_npy", "does not exist"),
                                          ("x2d", "x must have shape (T, B, I)")])
def test_run_input_names_the_flag(files, name, phrase, tmp_path):
    code, _, err = run_cli(["run", "gru", "-H", "3", "--input", str(files[name]), "-o", str(tmp_path / "o.npz")])
    assert code == 2 and err.startswith("error: --input") and phrase in err and "hint:" in err


@pytest.mark.parametrize("argv", [["show"], ["net"], ["train", "--steps", "1"], ["bench", "--config"]])
def test_a_binary_or_folder_file_argument_names_what_it_is(files, argv):
    for name in ("binary_json", "folder"):
        code, _, err = run_cli([*argv, str(files[name])])
        assert code == 2 and str(files[name]) in err, err
        assert "not UTF-8 text" in err or "is a folder" in err or "is not an anchor name" in err, err


@pytest.mark.parametrize("name, says", [(" ", "begins or ends with white space"), ("0 ", "begins or ends"),
                                        ("\tout.npz", "begins or ends"), ("out.npz\n", "begins or ends"),
                                        ("0\r0", "holds a control character"), ("a\nb.npz", "control character")])
def test_an_output_name_with_white_space_at_its_ends_or_a_control_character_is_refused(name, says, tmp_path):
    # legal names, but quoting slips: they were written as given, and "saved ... to 0 " read like "to 0"
    code, _, err = run_cli(["run", "gru", "-I", "2", "-H", "3", "-T", "2", "-B", "1", "-o", name], cwd=tmp_path)
    assert code == 2 and err.startswith("error: --output") and says in err and "hint:" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [["--split", "1,2", "--gpus", "1"], ["--chunk", "0"]])
def test_a_net_split_or_chunk_that_does_not_fit_is_refused_with_a_hint(extra, tmp_path):
    # the pipeline planner's errors had no hint line (found with CONTRACT_EXAMPLES=20000)
    code, _, err = run_cli(["net", "stack", "-I", "3", "-H", "3", "-T", "4", "-B", "2", "-o",
                            str(tmp_path / "net.npz"), *extra])
    assert code == 2 and err.startswith("error: ") and "\n  hint: " in err, err


def test_run_writes_exactly_the_path_it_prints(tmp_path):
    code, out, _ = run_cli(["run", "gru", "-I", "2", "-H", "3", "-T", "2", "-B", "1", "-o", "outputs"], cwd=tmp_path)
    assert code == 0 and out.splitlines()[-1].endswith(" to outputs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]
    assert set(np.load(tmp_path / "outputs")) == {"outputs", "final_h"}


def test_run_onto_a_folder_is_refused_before_running(tmp_path):
    code, out, err = run_cli(["run", "gru", "-o", str(tmp_path)])
    assert code == 2 and out == "" and "--output (outputs)" in err and "is a folder" in err
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_to_replace_a_file_unless_forced(tmp_path):
    argv = ["export", "gru", "-I", "3", "-H", "4", "-o", str(tmp_path / "out"), "--example", "2", "1"]
    code, out, _ = run_cli(argv)
    assert code == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["expected.bin", "gru_rnn.cu", "states.bin", "weights.bin", "x.bin"]
    assert f"wrote {tmp_path / 'out' / 'gru_rnn.cu'}" in out
    before = (tmp_path / "out" / "gru_rnn.cu").stat().st_mtime_ns
    code, out, err = run_cli(argv)
    assert code == 2 and out == "" and "exists and is not overwritten" in err and "--force" in err
    assert (tmp_path / "out" / "gru_rnn.cu").stat().st_mtime_ns == before
    assert run_cli(argv + ["--force"])[0] == 0


def test_export_writes_exactly_the_path_it_prints(tmp_path):
    code, out, _ = run_cli(["export", "gru", "-I", "3", "-H", "4", "-o", "prog.cu"], cwd=tmp_path)
    assert code == 0 and out.strip() == "wrote prog.cu" and (tmp_path / "prog.cu").is_file()
    (tmp_path / "notes").write_text("mine")
    code, _, err = run_cli(["export", "gru", "-I", "3", "-H", "4", "-o", "notes"], cwd=tmp_path)
    assert code == 2 and "'notes' is a file" in err and (tmp_path / "notes").read_text() == "mine"
    code, _, err = run_cli(["export", "gru", "-o", "x", "--example", "2", "-1"], cwd=tmp_path)
    assert code == 2 and "--example B: must be at least 1, got -1" in err and not (tmp_path / "x").exists()


def test_train_json_onto_a_folder_is_refused_before_training(tmp_path):
    (tmp_path / "results").mkdir()
    started = time.perf_counter()
    code, out, err = run_cli(["train", "lstm", "--steps", "300", "--json", "results"], cwd=tmp_path)
    assert time.perf_counter() - started < 1.0
    assert code == 2 and out == "" and err.startswith("error: --json (training results): 'results' is a folder")
    assert [p.name for p in tmp_path.iterdir()] == ["results"] and list((tmp_path / "results").iterdir()) == []


def test_train_json_is_written_whole_with_no_temporary_left(tmp_path):
    code, _, _ = run_cli(["train", "gru", "--steps", "2", "-H", "3", "--json", "r/results.json"], cwd=tmp_path)
    assert code == 0 and os.listdir(tmp_path / "r") == ["results.json"]
    assert json.loads((tmp_path / "r" / "results.json").read_text())["results"][0]["cell"] == "gru"


def test_bench_and_net_destinations_are_checked_before_the_work(tmp_path):
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(["bench", "--out", str(tmp_path / "file")])
    assert code == 2 and "--out: " in err and "is a file, not a folder" in err and "needs a CUDA GPU" not in err
    code, _, err = run_cli(["bench", "--copy-to", str(tmp_path / "file" / "sub")])
    assert code == 2 and "--copy-to" in err
    code, out, err = run_cli(["net", "stack", "-I", "3", "-H", "3", "--run", "-o", str(tmp_path)])
    assert code == 2 and out == "" and "--output (outputs)" in err


def test_an_internal_error_is_one_line_with_exit_1_and_the_way_to_the_traceback(monkeypatch):
    from engine.commands import presets

    def broken(args):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(presets, "main", broken)
    code, out, err = run_cli(["presets"])
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("internal error") and "ZeroDivisionError: a bug" in err and "--debug" in err
    assert "report it" in err and "Traceback" not in err
    code, _, err = run_cli(["--debug", "presets"])
    assert code == 1 and "Traceback (most recent call last)" in err and "ZeroDivisionError: a bug" in err
    assert err.splitlines()[-1].startswith("internal error")


@pytest.mark.parametrize("argv, env", [(["--debug", "show", "nope"], {}), (["show", "nope", "--debug"], {}),
                                       (["show", "nope"], {"ENGINE_DEBUG": "1"})])
def test_debug_prints_the_traceback_of_a_refusal(argv, env):
    code, _, err = run_cli(argv, env=env)
    assert code == 2 and "Traceback (most recent call last)" in err and "CellGraphError" in err
    assert err.splitlines()[-2].startswith("error: ") and err.splitlines()[-1].startswith("  hint: ")


def test_ctrl_c_exits_130(monkeypatch):
    from engine.commands import presets

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(presets, "main", interrupted)
    code, _, err = run_cli(["presets"])
    assert code == 130 and err.strip() == "interrupted"
