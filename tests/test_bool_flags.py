"""analysis/bool_flags.py: which `enabled=` conditions are bools, and the migration's `bool(...)`."""

import textwrap

import libcst as cst

from ampmigrate.analysis.bool_flags import bool_names, is_bool


def names(code: str):
    return bool_names(textwrap.dedent(code))


def test_argparse_store_true_and_bool_defaults_are_bools():
    found = names("""
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--fp16", action="store_true")
        parser.add_argument("--no-amp", dest="use_amp", action="store_false")
        parser.add_argument("--amp", type=int, default=-1)
        parser.add_argument("--opt-level", type=str, default="O1")

        def train(model, half=False, *, apex=True, level="O1"):
            self.half = half
            self.cuda_ok = torch.cuda.is_available() and not half
    """)
    assert {"fp16", "use_amp", "half", "apex", "cuda_ok"} <= found
    assert not {"amp", "opt_level", "level", "model"} & found


def test_one_other_binding_spoils_a_name():
    found = names("""
        USE_APEX = True
        try:
            import apex
        except ImportError:
            USE_APEX = False
        fp16 = False
        def run(cfg):
            fp16 = cfg["fp16"]           # a YAML value: maybe 0/1
        def g(is_apex):                   # no default
            pass
    """)
    assert found == {"USE_APEX"}


def test_is_bool_by_form_or_by_name():
    flags = frozenset({"fp16"})
    for code, expected in [
        ("args.fp16", True), ("self.args.fp16", True), ("args.amp", False), ('config["fp16"]', False),
        ('args.level != "O0"', True), ("not args.amp", True), ("True", True), ("bool(args.amp)", True),
        ("scaler.is_enabled()", True), ("getattr(args, 'amp', False)", False), ("args.fp16 and args.amp", False),
        ("args.fp16 or x > 1", True),
    ]:
        assert is_bool(cst.parse_expression(code), flags) is expected, code
