"""The Train page (app/views/train.py) through Streamlit's AppTest, on the CPU: cells trained side by side,
their curves and table shown, the comparison saved at once and opened again, and the refusals."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import engine


def tiny(at, steps: int = 12) -> None:
    """Settings that train in about a second a cell."""
    for field, value in (("hidden_size", 4), ("steps", steps), ("batch", 4), ("seq_len", 4)):
        at.number_input(key=f"train.{field}").set_value(value)
    at.run()


def chart_keys(at) -> list[str]:
    return [chart.proto.id.rsplit("-", 1)[-1] for chart in at.get("plotly_chart")]


def test_two_cells_train_side_by_side_and_the_comparison_is_saved(open_page):
    at = open_page("train")
    assert [t.value for t in at.title] == ["Train"]
    assert at.multiselect(key="train.cells").value == ["preset: lstm", "preset: gru"]
    tiny(at)
    at.button(key="train.run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert {"train.losses", "train.metrics"} <= set(chart_keys(at))
    table = at.dataframe[0].value
    assert list(table["cell"]) == ["lstm", "gru"]
    assert all(table["seconds"] >= 0) and all(table["parameters"] > 0)
    saved = list((Path(os.environ["RNN_DESIGNS_DIR"]) / "training").glob("adding-*.json"))
    assert len(saved) == 1, saved
    written = json.loads(saved[0].read_text())
    assert [r["cell"] for r in written["results"]] == ["lstm", "gru"]
    assert all(len(r["losses"]) == 12 for r in written["results"])
    assert any(str(saved[0]) in s.value for s in at.success)


def test_an_earlier_comparison_opens_from_its_file(open_page):
    at = open_page("train")
    tiny(at, steps=6)
    at.button(key="train.run").click().run()
    shown = at.dataframe[0].value
    at.session_state["train.results"] = []                      # as after a reload: nothing on show
    at.run()
    assert not at.dataframe
    at.button(key="train.show_saved").click().run()
    assert not at.error
    assert list(at.dataframe[0].value["cell"]) == list(shown["cell"])


def test_the_current_design_and_a_task_of_classes_train(open_page):
    at = open_page("train")
    at.multiselect(key="train.cells").set_value(["current design"]).run()
    at.selectbox(key="train.task").set_value("parity").run()
    assert "accuracy" in "\n".join(c.value for c in at.caption)
    tiny(at, steps=5)
    at.button(key="train.run").click().run()
    assert not at.error, [e.value for e in at.error]
    assert list(at.dataframe[0].value["cell"]) == [engine.preset("lstm").cell.name]
    assert "final accuracy" in at.dataframe[0].value.columns


def test_the_jsb_chorales_train_with_their_nll(open_page, jsb_subset):
    at = open_page("train")
    at.selectbox(key="train.task").set_value("jsb").run()
    caption = "\n".join(c.value for c in at.caption)
    assert "JSB Chorales" in caption and "metric: nll (lower is better" in caption
    tiny(at, steps=4)
    at.button(key="train.run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    assert list(table["cell"]) == ["lstm", "gru"] and all(table["final nll"] > 0) and all(table["test nll"] > 0)


def test_the_device_is_the_cpu_where_there_is_no_gpu_and_says_why(open_page):
    from engine.backends import gpu_status
    at = open_page("train")
    radio = at.radio(key="train.device")
    if gpu_status()[0]:
        assert radio.options == ["CPU, float64", "GPU, float32 (the fused training step)"]
        return
    assert radio.options == ["CPU, float64"] and radio.value == "CPU, float64"
    assert any("Training runs on the CPU: no GPU here" in c.value for c in at.caption)


def test_a_matmul_precision_trains_in_that_mode_and_is_saved_with_the_results(open_page):
    at = open_page("train")
    assert at.selectbox(key="train.precision").value == "float32 (strict)"
    at.multiselect(key="train.cells").set_value(["preset: gru"])
    at.selectbox(key="train.precision").set_value("bfloat16")
    tiny(at, steps=4)
    at.button(key="train.run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    saved = sorted((Path(os.environ["RNN_DESIGNS_DIR"]) / "training").glob("adding-*.json"))
    written = json.loads(saved[-1].read_text())
    assert [r["settings"]["precision"] for r in written["results"]] == ["bfloat16"]


def test_no_cell_chosen_says_so_and_trains_nothing(open_page):
    at = open_page("train")
    at.multiselect(key="train.cells").set_value([]).run()
    assert at.button(key="train.run").disabled
    assert any("at least one cell" in i.value for i in at.info)


def test_a_saved_design_that_is_not_a_cell_is_refused_by_name(open_page):
    folder = Path(os.environ["RNN_DESIGNS_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "broken.json").write_text('{"name": "broken", "nodes": [{"name": "x"}]}')
    at = open_page("train")
    at.multiselect(key="train.cells").set_value(["saved: broken"]).run()
    tiny(at, steps=3)
    at.button(key="train.run").click().run()
    assert not at.exception
    assert any("broken" in e.value and "cannot be trained" in e.value for e in at.error), [e.value for e in at.error]
    assert not at.dataframe


def study_form(at, **values) -> None:
    fields = {"cells": ["preset: lstm", "preset: gru"], "task": "adding", "seeds": 2, "lrs": "0.02, 0.005",
              "name": "tiny", "hidden_size": 4, "steps": 5, "batch": 4, "seq_len": 4} | values
    at.multiselect(key="study.cells").set_value(fields["cells"])
    at.selectbox(key="study.task").set_value(fields["task"])
    for field in ("seeds", "hidden_size", "steps", "batch", "seq_len"):
        at.number_input(key=f"study.{field}").set_value(fields[field])
    at.text_input(key="study.lrs").set_value(fields["lrs"])
    at.text_input(key="study.name").set_value(fields["name"])
    at.button(key="study.run").click().run()


@pytest.mark.xdist_group("ray")
def test_a_study_runs_from_the_page_and_shows_its_boxes_and_its_comparison(open_page):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r requirements.txt)")
    at = open_page("train")
    try:
        study_form(at)
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert any("Study 'tiny' finished" in s.value for s in at.success)
        assert "study.box" in chart_keys(at)
        assert "8 of 8 trials finished, 0 failed" in "\n".join(p.proto.text for p in at.get("progress"))
        comparison = [d.value for d in at.dataframe if "p (Welch)" in d.value.columns]
        assert comparison and list(comparison[0]["cell"]) == ["gru"]
        assert (Path(os.environ["RNN_DESIGNS_DIR"]) / "studies" / "tiny" / "trials.jsonl").is_file()
    finally:
        ray.shutdown()


@pytest.mark.parametrize("values, says", [({"lrs": "fast"}, "learning rates: write numbers"),
                                          ({"lrs": "0.01, -1"}, "learning rates: give one or more positive"),
                                          ({"name": "../up"}, "study name: letters, digits"),
                                          ({"cells": []}, "choose at least one cell")])
def test_a_bad_study_form_is_refused_naming_the_field(open_page, values, says):
    at = open_page("train")
    study_form(at, **values)
    assert not at.exception
    assert any(says in e.value for e in at.error), [e.value for e in at.error]


def test_the_published_odyssey_study_opens_with_its_comparison(open_page):
    at = open_page("train")
    label = "odyssey-jsb-20261127 (published)"
    assert label in at.selectbox(key="study.shown").options
    at.selectbox(key="study.shown").set_value(label).run()
    assert not at.exception and not at.error
    assert "study.box" in chart_keys(at)
    assert "90 of 90 trials finished, 0 failed" in "\n".join(p.proto.text for p in at.get("progress"))
    (comparison,) = [d.value for d in at.dataframe if "p (Welch)" in d.value.columns]
    assert len(comparison) == 8 and set(comparison["verdict"]) <= {"better", "worse", "no significant difference"}


@pytest.mark.xdist_group("ray")
def test_an_unfinished_study_resumes_from_the_page(open_page):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r requirements.txt)")
    from engine.study import StudyPlan, store
    plan = StudyPlan.make(["gru"], "adding", seeds=2, settings={"hidden_size": 3, "steps": 3, "seq_len": 4,
                                                                "batch": 2, "eval_batch": 4, "device": "cpu"})
    store.open_folder(Path(os.environ["RNN_DESIGNS_DIR"]) / "studies" / "halfway", plan)
    at = open_page("train")
    at.selectbox(key="study.shown").set_value("halfway").run()
    assert any("2 trial(s) to run" in c.value for c in at.caption)
    try:
        at.button(key="study.resume").click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert any("resumed: 2 of 2 trials finished" in s.value for s in at.success)
    finally:
        ray.shutdown()
