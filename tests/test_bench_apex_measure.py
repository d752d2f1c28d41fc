"""bench/apex/measure.py's line map: which original lines a fix changed, and what they became."""

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "bench" / "apex" / "measure.py"
_SPEC = importlib.util.spec_from_file_location("apex_measure", _PATH)
measure = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = measure
_SPEC.loader.exec_module(measure)


def test_unchanged_lines_map_one_to_one_after_a_removed_import():
    before = ["from apex import amp", "import torch", "x = 1", "y = 2"]
    after = ["import torch", "x = 1", "y = 2"]
    mapping = measure.line_map(before, after)
    assert mapping[1] == (True, range(1, 1))  # removed: changed, became nothing
    assert mapping[3] == (False, range(2, 3))
    assert mapping[4] == (False, range(3, 4))


def test_a_replaced_block_maps_each_of_its_lines_to_the_whole_replacement():
    before = ["a = 1", "with amp.scale_loss(l, o) as s:", "    s.backward()", "b = 2"]
    after = ["a = 1", "scaler.scale(l).backward()", "b = 2"]
    mapping = measure.line_map(before, after)
    assert mapping[2] == (True, range(2, 3))
    assert mapping[3] == (True, range(2, 3))
    assert mapping[4] == (False, range(3, 4))


def test_annotations_load_with_a_string_or_list_scope(tmp_path):
    (tmp_path / "a.toml").write_text(
        'repo = "o/n"\ncommit = "c"\nscope = "tools"\n'
        'sites = [{path = "t.py", line = 3, api = "initialize", why = "w"}]\n'
    )
    (tmp_path / "b.toml").write_text('repo = "o/m"\ncommit = "d"\nsites = []\n')
    loaded = measure.load(tmp_path)
    assert [a.scope for a in loaded] == [["tools"], None]
    assert loaded[0].sites == [measure.Site("t.py", 3, "initialize", "w")]
